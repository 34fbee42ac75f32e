package idemflowtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/workflow"
)

// TestWatcher: a load of requests keeps the invariants; each way of breaking them by
// hand is reported.
func TestWatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemflowtest.NewDB(t, ledgerSchema)
	remote := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{FailRate: 0.3})
	flow := ledgerFlow(db, remote, flowOpts{})
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Register(flow))

	w := idemflowtest.NewWatcher(flow)
	w.Start(ctx, db.NewPool(t))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 10 {
				req := workflow.Request{Scope: "acct", Key: string(rune('a'+i)) + string(rune('a'+j)), Flow: "ledger", Method: "POST", Route: "/", Body: []byte(`{}`)}
				for range 20 { // the remote fails now and then; the client retries
					if _, err := e.Do(ctx, req); err == nil {
						break
					}
					idemflowtest.ExpireLease(t, db.Pool, req.Scope, req.Key)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Stop())
	require.Positive(t, w.Snapshots())
	_, failed := remote.Total()
	require.Positive(t, failed, "the remote's failures fired")

	for _, tc := range []struct{ name, sql, want string }{
		{"LockVersionBack", `UPDATE idemflow_keys SET lock_version = 0 WHERE idempotency_key = 'aa'`, "lock version moved back"},
		{"FinishedChanged", `UPDATE idemflow_keys SET response_body = 'x' WHERE idempotency_key = 'ab'`, "a finished row changed"},
		{"RecoveryPointBack", "", ""}, // below
		{"UnknownPoint", `UPDATE idemflow_keys SET status = 'in_progress', recovery_point = 'nowhere', response_status = NULL,
			response_body = NULL, response_headers = NULL, finished_at = NULL WHERE idempotency_key = 'ad'`, "is not a phase of flow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := idemflowtest.NewWatcher(flow)
			require.NoError(t, w.Snapshot(ctx, db.Pool))
			require.NoError(t, w.Err())
			if tc.want == "" { // two steps: finished -> debit is a change of a finished row; debit -> started moves back
				_, err := db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'in_progress', recovery_point = 'debit', response_status = NULL,
					response_body = NULL, response_headers = NULL, finished_at = NULL WHERE idempotency_key = 'ac'`)
				require.NoError(t, err)
				require.NoError(t, w.Snapshot(ctx, db.Pool))
				require.ErrorContains(t, w.Err(), "a finished row changed")
				w = idemflowtest.NewWatcher(flow)
				require.NoError(t, w.Snapshot(ctx, db.Pool))
				_, err = db.Pool.Exec(ctx, `UPDATE idemflow_keys SET recovery_point = 'started' WHERE idempotency_key = 'ac'`)
				require.NoError(t, err)
				require.NoError(t, w.Snapshot(ctx, db.Pool))
				require.ErrorContains(t, w.Err(), "recovery point moved back from debit to started")
				return
			}
			_, err := db.Pool.Exec(ctx, tc.sql)
			require.NoError(t, err)
			require.NoError(t, w.Snapshot(ctx, db.Pool))
			require.ErrorContains(t, w.Err(), tc.want)
		})
	}
}
