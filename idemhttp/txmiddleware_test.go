package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// ordersSchema is the table the TxMiddleware tests' handler writes to: one row per
// order, named by the idempotency key it was made under.
const ordersSchema = `CREATE TABLE orders (id bigserial PRIMARY KEY, ref text NOT NULL, body text NOT NULL)`

// orders is the handler the TxMiddleware tests wrap: it inserts an order through the
// request's transaction and answers 201 naming it, or with status when that is set.
type orders struct {
	runs   atomic.Int32
	status atomic.Int32 // answer this status instead of 201 while non-zero
	panics atomic.Bool  // panic after the insert
	// inserted, when set, runs after the insert with the transaction still open.
	inserted func(r *http.Request, tx phases.DBTX)
}

func (h *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	tx := idemhttp.TxFromContext(r.Context())
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var id int64
	err := tx.QueryRow(r.Context(), `INSERT INTO orders (ref, body) VALUES ($1, $2) RETURNING id`,
		r.Header.Get(idemhttp.KeyHeader), string(body)).Scan(&id)
	if err != nil {
		http.Error(w, "insert: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if h.inserted != nil {
		h.inserted(r, tx)
	}
	if h.panics.Load() {
		panic("boom")
	}
	if s := h.status.Load(); s != 0 {
		http.Error(w, "handler failed", int(s))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/v1/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d}`, id)
}

// ordersFor counts the orders made under key.
func ordersFor(t *testing.T, db *pgtest.DB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE ref = $1`, key).Scan(&n))
	return n
}

// txMiddlewareServer serves h behind the engine's TxMiddleware at POST /v1/orders.
func txMiddlewareServer(t *testing.T, e *workflow.Engine, h http.Handler) *httptest.Server {
	t.Helper()
	mw, err := idemhttp.TxMiddleware(e, &idemhttp.Config{Scope: bearerScope, RequireKey: true, ProblemTypeBase: serviceTypeBase})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw(h))
	return newServer(t, mux)
}

func setupOrders(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, setupOpts{})
	_, err := b.db.Pool.Exec(context.Background(), ordersSchema)
	require.NoError(t, err)
	return b
}

func TestTxMiddleware(t *testing.T) {
	t.Parallel()
	b := setupOrders(t)

	t.Run("CommitsWithTheAnswer", func(t *testing.T) { testTxMiddlewareCommitsWithTheAnswer(t, b) })
	t.Run("ConcurrentDuplicates", func(t *testing.T) { testTxMiddlewareConcurrentDuplicates(t, b) })
	t.Run("FiveHundredLeavesNothing", func(t *testing.T) { testTxMiddlewareFiveHundredLeavesNothing(t, b) })
	t.Run("PanicLeavesNothing", func(t *testing.T) { testTxMiddlewarePanicLeavesNothing(t, b) })
	t.Run("ResponseTooLargeLeavesNothing", func(t *testing.T) { testTxMiddlewareResponseTooLargeLeavesNothing(t, b) })
	t.Run("WithoutKey", func(t *testing.T) { testTxMiddlewareWithoutKey(t, b) })
}

func testTxMiddlewareCommitsWithTheAnswer(t *testing.T, b *bundle) {
	t.Parallel()
	h := &orders{}
	srv := txMiddlewareServer(t, b.engine, h)
	first := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_commit", "commit-k"), `{"a":1}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	require.False(t, first.replayed())
	require.Equal(t, 1, ordersFor(t, b.db, "commit-k"))
	st := state(t, b.db, "acct_commit", "commit-k")
	require.Equal(t, "finished", st.Status)
	require.Equal(t, phases.Finished, st.RecoveryPoint)
	require.False(t, st.HasLease)

	for range 2 {
		again := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_commit", "commit-k"), `{"a":1}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.True(t, again.replayed())
		require.Equal(t, first.body, again.body)
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	}
	require.EqualValues(t, 1, h.runs.Load())
	require.Equal(t, 1, ordersFor(t, b.db, "commit-k"))

	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_commit", "commit-k"), `{"a":2}`)
	requireProblem(t, r, http.StatusUnprocessableEntity)
	require.EqualValues(t, 1, h.runs.Load())
}

func testTxMiddlewareConcurrentDuplicates(t *testing.T, b *bundle) {
	t.Parallel()
	release := make(chan struct{})
	// The executor holds its transaction open, the order inserted but not
	// committed, until the others are answered.
	h := &orders{inserted: func(r *http.Request, _ phases.DBTX) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}}
	srv := txMiddlewareServer(t, b.engine, h)
	got := duplicates(t, srv, "/v1/orders", keyed("acct_dup", "dup-k"), `{"a":1}`, 20, release)
	winner := checkDuplicates(t, got, http.StatusCreated)
	require.EqualValues(t, 1, h.runs.Load(), "the handler ran once")
	require.Equal(t, 1, ordersFor(t, b.db, "dup-k"))

	requireReplay(t, srv, "/v1/orders", keyed("acct_dup", "dup-k"), `{"a":1}`, winner)
	require.EqualValues(t, 1, h.runs.Load())
}

func testTxMiddlewareFiveHundredLeavesNothing(t *testing.T, b *bundle) {
	t.Parallel()
	h := &orders{}
	h.status.Store(http.StatusInternalServerError)
	srv := txMiddlewareServer(t, b.engine, h)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_5xx", "5xx-k"), `{}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Equal(t, "handler failed\n", string(r.body), "the handler's own answer is passed on")
	requireRetryAfter(t, r)
	require.Zero(t, ordersFor(t, b.db, "5xx-k"), "the handler's insert rolled back")
	require.Zero(t, rowsFor(t, b.db, "acct_5xx", "5xx-k"), "no key row")

	h.status.Store(0)
	r = mustSend(t, srv, "POST", "/v1/orders", keyed("acct_5xx", "5xx-k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.False(t, r.replayed())
	require.EqualValues(t, 2, h.runs.Load(), "the retry runs the handler again")
	require.Equal(t, 1, ordersFor(t, b.db, "5xx-k"))
}

func testTxMiddlewarePanicLeavesNothing(t *testing.T, b *bundle) {
	t.Parallel()
	h := &orders{}
	h.panics.Store(true)
	srv := txMiddlewareServer(t, b.engine, h)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_panic", "panic-k"), `{}`)
	requireProblem(t, r, http.StatusInternalServerError)
	require.NotContains(t, string(r.body), "boom")
	require.Zero(t, ordersFor(t, b.db, "panic-k"))
	require.Zero(t, rowsFor(t, b.db, "acct_panic", "panic-k"))

	h.panics.Store(false)
	r = mustSend(t, srv, "POST", "/v1/orders", keyed("acct_panic", "panic-k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 1, ordersFor(t, b.db, "panic-k"))
}

func testTxMiddlewareResponseTooLargeLeavesNothing(t *testing.T, b *bundle) {
	t.Parallel()
	e, err := workflow.New(b.db.Pool, &workflow.Config{MaxResponseBytes: 4})
	require.NoError(t, err)
	h := &orders{}
	srv := txMiddlewareServer(t, e, h)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_large", "large-k"), `{}`)
	requireProblem(t, r, http.StatusInternalServerError)
	require.NotContains(t, string(r.body), "order", "never truncated")
	require.Zero(t, ordersFor(t, b.db, "large-k"), "the insert rolled back with the answer")
	require.Zero(t, rowsFor(t, b.db, "acct_large", "large-k"))
}

func testTxMiddlewareWithoutKey(t *testing.T, b *bundle) {
	t.Parallel()
	h := &orders{}
	mw, err := idemhttp.TxMiddleware(b.engine, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw(h))
	srv := newServer(t, mux)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_nokey", ""), `{}`)
	require.Equal(t, http.StatusInternalServerError, r.status, "no key, no transaction: the handler sees nil")
	require.Equal(t, "no transaction\n", string(r.body))
}

func TestTxFromContext(t *testing.T) {
	t.Parallel()
	require.Nil(t, idemhttp.TxFromContext(context.Background()))

	b := setup(t, setupOpts{})
	var seen atomic.Bool
	srv := middlewareServer(t, b.engine, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(idemhttp.TxFromContext(r.Context()) != nil)
		w.WriteHeader(http.StatusNoContent)
	}))
	r := mustSend(t, srv, "POST", "/v1/things/x", keyed("acct", "k"), `{}`)
	require.Equal(t, http.StatusNoContent, r.status)
	require.False(t, seen.Load(), "Middleware's handler runs outside any transaction")
}

func TestTxMiddlewareConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	_, err = idemhttp.TxMiddleware(e, nil)
	require.ErrorContains(t, err, "Scope is required")

	_, err = idemhttp.TxMiddleware(e, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err)
	_, err = idemhttp.TxMiddleware(e, &idemhttp.Config{Scope: bearerScope})
	require.NoError(t, err, "TxMiddleware may be called again on the same engine")
	f, ok := e.Flow(idemhttp.TxMiddlewareFlow)
	require.True(t, ok)
	require.True(t, f.ClientOnly, "only the client can finish its keys")

	e2, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e2.Register(phases.Flow{Name: idemhttp.TxMiddlewareFlow, Phases: []phases.Phase{
		phases.Tx("t", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }),
	}}))
	_, err = idemhttp.TxMiddleware(e2, &idemhttp.Config{Scope: bearerScope})
	require.ErrorContains(t, err, "reserved")
}

// TestTxMiddlewareTxEndsWithHandler: a handler's transaction ends when the handler
// returns. On a pool of ONE connection, tenant a's handler keeps its transaction; while
// tenant b's handler holds that connection in its own open transaction, a's kept
// transaction refuses every call with phases.ErrTxDone, and b's commit carries b's
// order alone.
func TestTxMiddlewareTxEndsWithHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrders(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(t, err)

	kept := make(chan phases.DBTX, 1)
	inTx, release := make(chan struct{}), make(chan struct{})
	h := &orders{inserted: func(r *http.Request, tx phases.DBTX) {
		switch r.Header.Get(idemhttp.KeyHeader) {
		case "a-k":
			kept <- tx
		case "b-k":
			close(inTx)
			<-release
		}
	}}
	srv := txMiddlewareServer(t, e, h)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_a", "a-k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	tx := <-kept

	answered := make(chan reply, 1)
	go func() {
		r, err := send(ctx, srv, "POST", "/v1/orders", keyed("acct_b", "b-k"), `{}`)
		if err != nil {
			r.status = 0
		}
		answered <- r
	}()
	<-inTx
	_, lateErr := tx.Exec(ctx, `INSERT INTO orders (ref, body) VALUES ('a-late', '')`)
	var id int64
	rowErr := tx.QueryRow(ctx, `INSERT INTO orders (ref, body) VALUES ('a-late', '') RETURNING id`).Scan(&id)
	_, asTxErr := tx.(pgx.Tx).Begin(ctx)
	close(release)
	require.Equal(t, http.StatusCreated, (<-answered).status, "tenant b is answered")

	require.Zero(t, ordersFor(t, b.db, "a-late"), "nothing of a's late calls committed, in b's transaction or elsewhere")
	require.ErrorIs(t, lateErr, phases.ErrTxDone, "Exec after the handler returned")
	require.ErrorIs(t, rowErr, phases.ErrTxDone, "QueryRow after the handler returned")
	require.ErrorIs(t, asTxErr, phases.ErrTxDone, "the pgx.Tx view after the handler returned")
	require.Equal(t, 1, ordersFor(t, b.db, "a-k"))
	require.Equal(t, 1, ordersFor(t, b.db, "b-k"))
}

// TestTxMiddlewareHandlerOutlivesLease: a handler that goes on past its lease (it
// ignores its context) is answered 503 lease-expired, which says so, instead of
// "unavailable"; nothing it wrote commits, and the retry runs it within its lease.
//
// The retry goes through an engine with a long lease: with the hung attempt's lease of
// a second it had to claim, run and commit within a second, which a stalled machine
// does not (shown by a temporary 1.1 s sleep before the claim: the retry got a 503).
func TestTxMiddlewareHandlerOutlivesLease(t *testing.T) {
	t.Parallel()
	b := setupOrders(t)
	e, err := workflow.New(b.db.Pool, &workflow.Config{Lease: time.Second})
	require.NoError(t, err)
	var hang atomic.Bool
	hang.Store(true)
	h := &orders{inserted: func(r *http.Request, _ phases.DBTX) {
		if hang.Load() {
			<-r.Context().Done() // past the lease: the context ends with it
		}
	}}
	srv := txMiddlewareServer(t, e, h)
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_hung", "hung-k"), `{}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, serviceTypeBase+"lease-expired", p.Type)
	require.Contains(t, p.Detail, "ran out of its time")
	requireRetryAfter(t, r)
	require.Zero(t, ordersFor(t, b.db, "hung-k"), "nothing of the attempt committed")
	require.Zero(t, rowsFor(t, b.db, "acct_hung", "hung-k"))

	hang.Store(false)
	patient, err := workflow.New(b.db.Pool, &workflow.Config{Lease: time.Minute})
	require.NoError(t, err)
	r = mustSend(t, txMiddlewareServer(t, patient, h), "POST", "/v1/orders", keyed("acct_hung", "hung-k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 1, ordersFor(t, b.db, "hung-k"))
}

// TestTxMiddlewareHungHolderTerminated: a handler that hangs holds its key's claim
// lock (duplicates get 409); the query docs/OPERATIONS.md gives finds its session, and
// pg_terminate_backend on it lets the retry claim the key and finish it. The hung
// handler, let go afterwards, commits nothing: one order for the key.
func TestTxMiddlewareHungHolderTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOrders(t)
	app := "hung-" + b.db.Schema
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(t, err)

	hung, letGo := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(letGo) }) }
	defer release() // also when a check fails: the server's Close waits for the handler
	var hang atomic.Bool
	hang.Store(true)
	h := &orders{inserted: func(r *http.Request, _ phases.DBTX) {
		if hang.CompareAndSwap(true, false) {
			close(hung)
			<-letGo // ignores its context
		}
	}}
	srv := txMiddlewareServer(t, e, h)
	first := make(chan reply, 1)
	go func() {
		r, _ := send(ctx, srv, "POST", "/v1/orders", keyed("acct_hold", "hold-k"), `{}`)
		first <- r
	}()
	<-hung
	r := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_hold", "hold-k"), `{}`)
	require.Equal(t, http.StatusConflict, r.status, "the claim lock is held")

	// The operator's query, from the runbook, with the lease's 30 s as 0 s.
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "### An attempt that holds a claim lock")
	require.True(t, ok)
	_, rest, ok = strings.Cut(rest, "```sql\n")
	require.True(t, ok)
	query, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	query = strings.Replace(query, "interval '30 seconds'", "interval '0 seconds'", 1)
	rows, err := b.db.Pool.Query(ctx, `SELECT pid FROM (`+query+`) q WHERE application_name = $1`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, pids, 1, "the runbook's query finds the hung holder")
	var ended bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1::int)`, pids[0]).Scan(&ended))
	require.True(t, ended)
	// pg_terminate_backend only signals: wait until the server shows the backend gone.
	require.Eventually(t, func() bool {
		var n int
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pids[0]).Scan(&n)
		return err == nil && n == 0
	}, time.Minute, 5*time.Millisecond)

	r = mustSend(t, srv, "POST", "/v1/orders", keyed("acct_hold", "hold-k"), `{}`)
	require.Equal(t, http.StatusCreated, r.status, "the retry claims the key once the holder is gone: %s", r.body)
	release()
	late := <-first
	require.Equal(t, http.StatusServiceUnavailable, late.status, "the hung attempt commits nothing: %s", late.body)
	require.Equal(t, 1, ordersFor(t, b.db, "hold-k"), "one order for the key")
	again := mustSend(t, srv, "POST", "/v1/orders", keyed("acct_hold", "hold-k"), `{}`)
	require.True(t, again.replayed())
	require.Equal(t, r.body, again.body)
}
