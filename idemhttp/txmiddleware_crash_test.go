package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// Where a TxMiddleware crash child SIGKILLs itself: before the COMMIT of the
// handler's writes and its answer, and after it.
const (
	txCrashBeforeCommit = "before-commit"
	txCrashAfterCommit  = "after-commit"
)

const (
	envTxCrashPoint = "IDEMFLOW_TXMW_CRASH_POINT"
	envTxCrashDB    = "IDEMFLOW_TXMW_CRASH_DB_URL"
	envTxCrashKey   = "IDEMFLOW_TXMW_CRASH_KEY"
)

// backendLine is what the crash child's handler prints: the backend its transaction
// runs on, so that the parent can wait for the server to notice the child's death.
type backendLine struct {
	BackendPID int `json:"backend_pid"`
}

func init() { childproc.Register("txcrash", runTxCrashChild) }

// runTxCrashChild serves one TxMiddleware request and dies at the crash point.
func runTxCrashChild() {
	point := os.Getenv(envTxCrashPoint)
	die := func(at string) {
		if at == point {
			childproc.Kill()
		}
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envTxCrashDB))
	if err != nil {
		childproc.Fail("connect", err)
	}
	e, err := workflow.New(pool, &workflow.Config{Hooks: workflow.Hooks{
		BeforeCommit: func(context.Context, workflow.PhaseEvent) { die(txCrashBeforeCommit) },
		PhaseEnd: func(_ context.Context, _ workflow.PhaseEvent, err error) {
			if err == nil {
				die(txCrashAfterCommit)
			}
		},
	}})
	if err != nil {
		childproc.Fail("engine", err)
	}
	mw, err := idemhttp.TxMiddleware(e, &idemhttp.Config{Scope: bearerScope, RequireKey: true})
	if err != nil {
		childproc.Fail("middleware", err)
	}
	h := &orders{inserted: func(r *http.Request, tx phases.DBTX) {
		var pid int
		if err := tx.QueryRow(r.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			childproc.Fail("backend pid", err)
		}
		childproc.Emit(backendLine{BackendPID: pid})
	}}
	req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":250}`))
	req.Header = keyed("acct", os.Getenv(envTxCrashKey))
	rec := httptest.NewRecorder()
	mw(h).ServeHTTP(rec, req)
	childproc.Fail("the crash point "+point+" never fired; answered", fmt.Errorf("%d %s", rec.Code, rec.Body))
}

// waitBackendGone waits until the server has ended backend pid, whose client was
// killed: until then it may still hold the key's claim lock.
func waitBackendGone(t *testing.T, db *pgtest.DB, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var alive bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive)
		require.NoError(t, err, "backend %d still there", pid)
		if !alive {
			return
		}
	}
}

// TestTxMiddlewareCrash kills a server process (SIGKILL) serving a TxMiddleware
// request before and after the COMMIT of the handler's insert and its answer: either
// way there is one order, and every retry gets the same answer.
func TestTxMiddlewareCrash(t *testing.T) {
	t.Parallel()
	b := setupOrders(t)
	for _, point := range []string{txCrashBeforeCommit, txCrashAfterCommit} {
		t.Run(point, func(t *testing.T) {
			key := "txcrash-" + point
			child := childproc.Start(t, "^$", childproc.Program("txcrash"),
				envTxCrashPoint+"="+point, envTxCrashDB+"="+b.db.URL, envTxCrashKey+"="+key)
			var line backendLine
			child.Next(t, 2*time.Minute, &line) // the child's handler ran
			killed, rest := child.Killed(t)
			require.True(t, killed, "child was not killed at %s: %q", point, rest)
			waitBackendGone(t, b.db, line.BackendPID)

			h := &orders{}
			srv := txMiddlewareServer(t, b.engine, h)
			if point == txCrashBeforeCommit {
				require.Equal(t, "", keyRow(t, b.db, "acct", key), "nothing committed: no key row")
				require.Zero(t, ordersFor(t, b.db, key), "nothing committed: no order")
			} else {
				require.Equal(t, "finished", state(t, b.db, "acct", key).Status)
				require.Equal(t, 1, ordersFor(t, b.db, key))
			}

			first := mustSend(t, srv, "POST", "/v1/orders", keyed("acct", key), `{"amount":250}`)
			require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
			if point == txCrashBeforeCommit {
				require.False(t, first.replayed())
				require.EqualValues(t, 1, h.runs.Load(), "the retry runs the handler once more")
			} else {
				require.True(t, first.replayed(), "the child's committed answer")
				require.Zero(t, h.runs.Load())
			}
			require.Equal(t, 1, ordersFor(t, b.db, key), "one effect")
			var id int64
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT id FROM orders WHERE ref = $1`, key).Scan(&id))
			require.Equal(t, fmt.Sprintf(`{"order":%d}`, id), string(first.body), "the answer names the one order")

			requireReplay(t, srv, "/v1/orders", keyed("acct", key), `{"amount":250}`, first)
			require.Equal(t, 1, ordersFor(t, b.db, key))
		})
	}
}
