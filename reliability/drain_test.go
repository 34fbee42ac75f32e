package reliability

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestDrainHTTP sends SIGTERM to a charges server (examples/charges, which drains its
// engine on SIGTERM within -shutdown-timeout) while one attempt is in a tx phase
// (finalize, held by a row lock the test takes) and another in a call longer than the
// deadline (the provider holds it). The server must release both keys before it exits,
// fenced: the retries sent to a second server are answered finally on their first try
// (a key left leased would be answered 409 until its 30s lease ran out), and each key
// has one payment at the provider and one charge.
func TestDrainHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	a := env.startServerWith(t, []string{"-shutdown-timeout", "2s"})
	b := env.startServer(t)

	keyOf := func(r *http.Request) string {
		id := strings.TrimSuffix(r.Header.Get("Idempotency-Key"), ":"+chargeflow.PhaseProvider)
		var key string
		_ = env.db.Pool.QueryRow(ctx, `SELECT idempotency_key FROM idemflow_keys WHERE id::text = $1`, id).Scan(&key)
		return key
	}
	var (
		inCall, inTx = make(chan struct{}), make(chan struct{})
		holdCall     = make(chan struct{})
		lock         pgx.Tx
		once         sync.Once
	)
	release := func() {
		once.Do(func() {
			close(holdCall)
			if lock != nil {
				_ = lock.Rollback(ctx)
			}
		})
	}
	env.provider.During(func(r *http.Request) {
		select {
		case <-holdCall: // released: the retries pass
			return
		default:
		}
		switch keyOf(r) {
		case "call": // a call longer than the drain's deadline
			close(inCall)
			<-holdCall
		case "tx": // the charge row is locked, so that finalize waits in its transaction
			tx, err := env.db.Pool.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, `SELECT 1 FROM charges WHERE account_id = 'acct' AND idempotency_key = 'tx' FOR UPDATE`)
			}
			if err != nil {
				t.Errorf("lock the charge row: %v", err)
			}
			lock = tx
			close(inTx)
		}
	})
	t.Cleanup(release)

	answers := make(chan answer, 2)
	for i, key := range []string{"call", "tx"} {
		go func() { answers <- env.post(t, env.client, a, request("acct", key, chargeflow.FlowName, int64(10+i))) }()
	}
	<-inCall
	<-inTx
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	<-a.done // the process drained and exited
	require.Contains(t, a.output(), "charges: drain", "the server did not drain:\n%s", a.output())
	for range 2 {
		got := <-answers
		require.True(t, got.Retryable, "an attempt given up by the drain was answered finally: %+v", got)
	}
	release()

	for i, key := range []string{"call", "tx"} {
		got := env.post(t, env.client, b, request("acct", key, chargeflow.FlowName, int64(10+i)))
		require.Equal(t, http.StatusCreated, got.Status, "key %s: the first retry on the second server: %s", key, got.Body)
	}
	payments, _, _, _ := env.provider.snapshot()
	require.Len(t, payments, 2, "one payment per key")
	var charges int
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account_id = 'acct'`).Scan(&charges))
	require.Equal(t, 2, charges, "one charge per key")
	t.Logf("drain: server A's log:\n%s", a.output())
}
