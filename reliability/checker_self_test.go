package reliability

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// captureTB records the errors the checker reports instead of failing the test.
type captureTB struct {
	testing.TB
	errors []string
}

func (c *captureTB) Errorf(format string, args ...any) {
	c.errors = append(c.errors, fmt.Sprintf(format, args...))
}

// TestCheckerCatchesViolations breaks every invariant the checker guards on purpose
// and requires the checker to report each one: a checker that cannot fail proves
// nothing.
func TestCheckerCatchesViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	en := env.engine(env.pool(poolOpts{}), nil)
	a := request("acct", "a", chargeflow.FlowName, 100)
	b := request("acct", "b", twoCallFlow, 100)
	stuck := request("acct", "stuck", chargeflow.FlowName, 101)
	for _, req := range []workflow.Request{a, b} {
		_, err := env.do(ctx, en, req)
		require.NoError(t, err)
	}
	env.provider.FailNext(1)
	_, err := env.do(ctx, en, stuck)
	require.ErrorIs(t, err, workflow.ErrTransient)

	c0 := &captureTB{TB: t}
	clean := env.check(c0, checkOpts{keys: [][2]string{{"acct", "a"}, {"acct", "b"}}})
	require.Len(t, clean.Violations, 1, "the stuck key is the only violation so far: %v", clean.Violations)
	require.Equal(t, 1, clean.Unfinished)

	exec := func(sql string, args ...any) {
		_, err := env.db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	// A second effect for a.
	exec(`INSERT INTO charges (account_id, idempotency_key, amount, currency, source) VALUES ('acct', 'a', 100, 'usd', 'tok_visa')`)
	// The stuck key's lock version and recovery point go backwards.
	exec(`UPDATE idemflow_keys SET lock_version = lock_version + 1 WHERE idempotency_key = 'stuck'`)
	exec(`UPDATE idemflow_keys SET lock_version = lock_version - 1, recovery_point = 'started' WHERE idempotency_key = 'stuck'`)
	// A payment under a derived key that belongs to no key row.
	hr, err := http.NewRequest(http.MethodPost, env.provider.URL+"/v1/payments", bytes.NewReader([]byte(`{"amount":1}`)))
	require.NoError(t, err)
	hr.Header.Set("Idempotency-Key", "00000000-0000-4000-8000-000000000000:provider_charge")
	resp, err := env.client.Do(hr)
	require.NoError(t, err)
	resp.Body.Close()
	// A client answer that is neither retryable nor the stored one.
	env.answers.record("acct", "b", answer{Via: "test", Status: 201, Body: []byte(`{"forged":true}`)})
	// A submitted key with no row.
	keys := [][2]string{{"acct", "a"}, {"acct", "b"}, {"acct", "never-claimed"}}

	c := &captureTB{TB: t}
	r := env.check(c, checkOpts{keys: keys})
	require.NotEmpty(t, c.errors, "the checker reported the violations")
	require.Positive(t, r.DuplicateEffects, "a second effect row")
	require.GreaterOrEqual(t, r.AuditViolations, 2, "lock version and recovery point went back")
	require.Positive(t, r.OrphanPayment, "a payment of no key")
	require.Positive(t, r.BadAnswers, "a forged answer")
	require.GreaterOrEqual(t, r.Unfinished, 2, "the stuck key and the key never claimed")
}

// TestSideAndHistoryCheckersCatchViolations breaks what the side-effect check and the
// history checker guard, on purpose: side records of a transaction that did not own
// the key, of one that rolled back, a second committed run of a phase, a record no
// HTTP post matches; a second fresh answer that differs, a 422 for an identical
// request, a replayed 5xx, and a tx phase committed twice. Each must be reported.
func TestSideAndHistoryCheckersCatchViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t)).withSide(t)
	en := env.engine(env.pool(poolOpts{}), nil)
	req := request("acct", "l", ledgerFlow, 100)
	_, err := env.do(ctx, en, req)
	require.NoError(t, err)
	c0 := &captureTB{TB: t}
	clean := env.check(c0, checkOpts{keys: [][2]string{{"acct", "l"}}, side: sideOpts{noRollbacks: true}})
	require.Empty(t, clean.Violations)

	var rowID string
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT id::text FROM idemflow_keys WHERE idempotency_key = 'l'`).Scan(&rowID))
	var committed, aborted int64
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&committed))
	tx, err := env.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&aborted))
	require.NoError(t, tx.Rollback(ctx))
	// A committed second run of debit, by a transaction that did not own the key and
	// posted nothing; a run of post that rolled back.
	_, err = env.side.pool.Exec(ctx, `INSERT INTO rel_side (seq, scope, idem_key, row_id, phase, attempt, txid, pid, owner, lock_seen)
		VALUES (1001, 'acct', 'l', $1, 'debit', 2, $2, 0, false, true), (1002, 'acct', 'l', $1, 'post', 2, $3, 0, true, false)`, rowID, committed, aborted)
	require.NoError(t, err)
	// Answers: a second fresh answer that differs, a 422, a replayed 503.
	env.answers.record("acct", "l", answer{Via: "test", Status: 201, Body: []byte(`{"forged":true}`)})
	env.answers.record("acct", "l", answer{Via: "test", Status: 422, Body: []byte(`{}`)})
	env.answers.record("acct", "l", answer{Via: "test", Status: 503, Replayed: true, Retryable: true})
	// A tx phase committed twice.
	env.history.commits[[2]string{"acct", "l"}] = append(env.history.commits[[2]string{"acct", "l"}], commitRec{Phase: phaseDebit, LockVersion: 7})

	c := &captureTB{TB: t}
	r := env.check(c, checkOpts{keys: [][2]string{{"acct", "l"}}, side: sideOpts{noRollbacks: true}})
	all := strings.Join(r.Violations, "\n")
	for _, want := range []string{
		"made by a transaction that did not own the key",
		"attempt's transaction rolled back) with no fault injected",
		"phase debit committed its side effects 2 times, want 1",
		"never reached the HTTP side channel",
		"history: key acct/l: two fresh answers",
		"history: key acct/l: two different answers",
		"history: key acct/l: 422 for an identical request",
		"history: key acct/l: a 503 was replayed",
		"history: key acct/l: phase debit committed twice",
	} {
		require.Contains(t, all, want)
	}
}
