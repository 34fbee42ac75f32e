package reliability

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestCrashAsyncCommitBeforeCall crashes a single server, with no standby and no
// StandbyWait, whose commits are asynchronous (synchronous_commit off for the whole
// server, or for the engine's sessions only), the moment a call phase starts: SIGQUIT
// to the postmaster, an immediate shutdown. The commit that preceded the call holds
// the key row whose id the call's derived key is built from; if the crash lost it,
// the retry after the restart would claim a new row and pay again under a new derived
// key. The engine makes that commit durable on the server whatever synchronous_commit
// says, so the retry must find the row, resume it and pay once. Each shape that
// commits right before a call is crashed in turn: a Go-code tx phase then a call, a
// pipelined tx phase (one round trip: an implicit transaction) then a call, and a
// flow whose first phase is a call (the claim commits alone). As in
// TestFailoverAsyncCommit, the WAL writer is slowed and autovacuum is off, so that
// nothing but the engine flushes the WAL within the test.
func TestCrashAsyncCommitBeforeCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		server  []string // settings of the server
		session bool     // synchronous_commit off for the engine's sessions only
	}{
		{"ServerOff", []string{"synchronous_commit=off"}, false},
		{"SessionOff", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			srv := startPrimary(ctx, t, append([]string{"wal_writer_delay=10s", "autovacuum=off"}, tc.server...)...)
			setup := poolWith(ctx, t, srv.URL, "on") // the schema is durable
			require.NoError(t, migrations.Migrate(ctx, setup))
			require.NoError(t, testflow.CreateTables(ctx, setup))
			setup.Close()
			sc := ""
			if tc.session {
				sc = "off"
			}
			for _, flow := range []string{asyncGoCode, asyncPipelined, asyncCallFirst} {
				t.Run(flow, func(t *testing.T) { crashBeforeCallCommit(ctx, t, srv, sc, flow) })
			}
		})
	}
}

// The flows of TestCrashAsyncCommitBeforeCall.
const (
	asyncGoCode    = "GoCodeTxThenCall"
	asyncPipelined = "PipelinedTxThenCall"
	asyncCallFirst = "CallFirst"
	asyncPay       = "pay"
)

// crashBeforeCallCommit runs one request of flow on srv, whose engine's sessions run
// with synchronous_commit sc (the server's when ""), crashes srv as the call starts,
// restarts it and retries: one key row, the first attempt's derived key, one payment,
// one ledger row.
func crashBeforeCallCommit(ctx context.Context, t *testing.T, srv *pgtest.Dedicated, sc, flow string) {
	remote := idemflowtest.NewRemote(t, nil)
	key := "async-" + flow
	req := workflow.Request{Scope: "acct", Key: key, Flow: strings.ToLower(flow), Method: http.MethodPost, Route: "/charges", Body: []byte(`{"amount":5}`)}

	pool := poolWith(ctx, t, srv.URL, sc)
	var got string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got))
	require.Equal(t, "off", got, "the engine's sessions commit asynchronously")
	var derived string
	var crashed error
	first := asyncEngine(t, pool, remote, flow, func(run *phases.Run) {
		if derived == "" {
			derived = run.DerivedKey() // the call started: the commit before it was answered
			crashed = srv.Crash()
		}
	})
	_, err := first.Do(ctx, req)
	require.NotEmpty(t, derived, "the call phase never started: %v", err)
	require.Error(t, err, "the phase after the call cannot commit on a crashed server")
	require.NoError(t, crashed)
	require.Equal(t, 1, remote.Made(), "the first attempt's payment")
	pool.Close()

	require.NoError(t, srv.Restart(ctx))
	pool = poolWith(ctx, t, srv.URL, sc)
	had := idemflowtest.ExpireLease(t, pool, "acct", key) // the crashed attempt's lease
	res, err := asyncEngine(t, pool, remote, flow, nil).Do(ctx, req)
	require.NoError(t, err, "the retry after the restart")
	require.Equal(t, http.StatusCreated, res.Response.Status)
	require.Equal(t, 1, remote.Made(), "provider payments: the crash lost the commit before the call, and the retry paid under a new derived key")
	require.True(t, had, "the restarted server had no key row")
	var rows int
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), min(id::text) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&rows, &id))
	require.Equal(t, 1, rows, "key rows")
	require.Equal(t, derived, id+":"+asyncPay, "the retry's derived key")
	var ledger int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE scope = 'acct' AND idem_key = $1`, key).Scan(&ledger))
	require.Equal(t, 1, ledger, "ledger rows")
}

// asyncEngine returns an engine on pool with flow registered, its call paying at remote
// under the run's derived key after atCall (if set) ran.
func asyncEngine(t *testing.T, pool *pgxpool.Pool, remote *idemflowtest.Remote, flow string, atCall func(*phases.Run)) *workflow.Engine {
	t.Helper()
	e, err := workflow.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(asyncFlow(remote, flow, atCall)))
	return e
}

// asyncFlow is flow: a ledger row written by a Go-code or a pipelined tx phase (or by
// the last phase, for the call-first flow), then the payment, then the answer.
func asyncFlow(remote *idemflowtest.Remote, flow string, atCall func(*phases.Run)) phases.Flow {
	const insert = `INSERT INTO ledger (scope, idem_key, amount) VALUES ($1, $2, 5)`
	pay := phases.Call(asyncPay, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
		if atCall != nil {
			atCall(run)
		}
		return nil, payRemote(ctx, remote, run.DerivedKey())
	})
	answer := func(write bool) phases.Phase {
		return phases.Tx("answer", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if write {
				if _, err := tx.Exec(ctx, insert, run.Scope(), run.Key()); err != nil {
					return nil, err
				}
			}
			return &phases.Response{Status: http.StatusCreated, Body: []byte(`{}`)}, nil
		})
	}
	name := strings.ToLower(flow)
	switch flow {
	case asyncGoCode:
		return phases.Flow{Name: name, Phases: []phases.Phase{
			phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
				_, err := tx.Exec(ctx, insert, run.Scope(), run.Key())
				return nil, err
			}), pay, answer(false)}}
	case asyncPipelined: // no callback and no Then: one round trip, an implicit transaction
		return phases.Flow{Name: name, Phases: []phases.Phase{
			phases.Pipelined("reserve", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
				p.Queue(insert, run.Scope(), run.Key())
				return nil, nil
			}), pay, answer(false)}}
	}
	return phases.Flow{Name: name, Phases: []phases.Phase{pay, answer(true)}}
}

// payRemote makes the payment at remote under key.
func payRemote(ctx context.Context, remote *idemflowtest.Remote, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, remote.URL+"/pay", strings.NewReader(`{"amount":5}`))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("provider answered %d", resp.StatusCode)
	}
	return nil
}
