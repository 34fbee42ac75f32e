package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// TestExactFingerprintMismatch reuses a finished key with a body that differs from the
// first only beyond float64's precision: a different request, so 422 and nothing
// written, never a replay of the first charge.
func TestExactFingerprintMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, c := range map[string]struct{ first, respelled, reused string }{
		"BigInteger": {`{"amount":9007199254740992}`, `{"amount":9.007199254740992e15}`, `{"amount":9007199254740993}`},
		"Decimal":    {`{"amount":10}`, `{"amount":10.000e0}`, `{"amount":10.0000000000000001}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			first, err := b.engine.Do(ctx, chargeReq("acct", "k", c.first))
			require.NoError(t, err)
			require.Equal(t, 201, first.Response.Status)
			before := keyRow(t, b.db, "acct", "k")

			_, err = b.engine.Do(ctx, chargeReq("acct", "k", c.reused))
			require.ErrorIs(t, err, workflow.ErrMismatch)
			require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "a mismatch writes nothing")

			again, err := b.engine.Do(ctx, chargeReq("acct", "k", c.respelled))
			require.NoError(t, err, "the same value spelled otherwise is the same request")
			require.True(t, again.Replayed)
			require.Equal(t, first.Response.Body, again.Response.Body)
			requireOneEffect(t, b, "acct", "k")
			require.Equal(t, 1, b.provider.Made())
		})
	}
}

// TestV1FingerprintsStillReplay upgrades a finished key to what releases before v2
// stored, a 32-byte v1 fingerprint, and checks that retries still replay it, respelled
// too, and that another request is still a mismatch.
func TestV1FingerprintsStillReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	const body = `{"amount":500,"note":"a"}`
	first, err := b.engine.Do(ctx, chargeReq("acct", "k", body))
	require.NoError(t, err)

	v1 := workflow.FingerprintV1("POST", "/charges", []byte(body))
	tag, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET fingerprint = $3 WHERE scope = $1 AND idempotency_key = $2`,
		"acct", "k", v1[:])
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	before := keyRow(t, b.db, "acct", "k")

	for name, retry := range map[string]string{
		"SameBody":  body,
		"Respelled": "{ \"note\": \"\\u0061\", \"amount\": 5e2 }",
	} {
		t.Run(name, func(t *testing.T) {
			res, err := b.engine.Do(ctx, chargeReq("acct", "k", retry))
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, first.Response.Status, res.Response.Status)
			require.Equal(t, first.Response.Body, res.Response.Body)
		})
	}
	t.Run("OtherBody", func(t *testing.T) {
		_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":501,"note":"a"}`))
		require.ErrorIs(t, err, workflow.ErrMismatch)
	})
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "replays and mismatches leave the v1 row as it was")
	var stored []byte
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT fingerprint FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'k'`).Scan(&stored))
	require.Equal(t, v1[:], stored)
	requireOneEffect(t, b, "acct", "k")
}
