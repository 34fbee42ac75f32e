package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// deadKeys makes dead-lettered keys acct/<k>, each with last error "given up <k>".
func deadKeys(t *testing.T, b *bundle, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		b.provider.FailNext(1)
		_, err := b.engine.Do(ctx, req("acct", k, 2))
		require.ErrorIs(t, err, workflow.ErrTransient)
		_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'dead', last_error = 'given up ' || idempotency_key WHERE idempotency_key = $1`, k)
		require.NoError(t, err)
	}
}

// TestKeysBulk: `keys bulk` refuses to run without a filter, counts without -yes
// (and fails, changing nothing), counts with -dry-run, and with -yes acts on exactly
// the keys counted.
func TestKeysBulk(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deadKeys(t, b, "d1", "d2", "d3", "x1")
	rows := map[string]string{}
	for _, k := range []string{"d1", "d2", "d3", "x1"} {
		rows[k] = testflow.KeyRow(t, b.db.Pool, "acct", k)
	}
	unchanged := func(why string) {
		t.Helper()
		for k, r := range rows {
			require.Equal(t, r, testflow.KeyRow(t, b.db.Pool, "acct", k), "%s: %s", why, k)
		}
	}

	noFilter := b.cli(t, "keys", "bulk", "redrive")
	require.Equal(t, 2, noFilter.code)
	require.Contains(t, noFilter.stderr, "no filter")
	require.Equal(t, 2, b.cli(t, "keys", "bulk", "-scope", "acct", "purge").code)
	require.Equal(t, 2, b.cli(t, "keys", "bulk", "-scope", "acct", "-limit", "0", "redrive").code)
	unchanged("bad usage")

	dry := b.cli(t, "keys", "bulk", "-json", "-error", "given up d", "-dry-run", "redrive").ok(t).lines(t)
	require.EqualValues(t, 3, dry[0]["matched"])
	require.EqualValues(t, 0, dry[0]["acted"])
	unchanged("dry run")

	unconfirmed := b.cli(t, "keys", "bulk", "-error", "given up d", "redrive")
	require.Equal(t, 1, unconfirmed.code)
	require.Contains(t, unconfirmed.stdout, "would redrive 3 keys")
	require.Contains(t, unconfirmed.stderr, "run again with -yes")
	unchanged("no -yes")

	done := b.cli(t, "keys", "bulk", "-json", "-error", "given up d", "-yes", "redrive").ok(t).lines(t)
	require.EqualValues(t, dry[0]["matched"], done[0]["acted"], "acted on what the dry run counted")
	for _, k := range []string{"d1", "d2", "d3"} {
		require.Equal(t, "in_progress", testflow.State(t, b.db.Pool, "acct", k).Status, k)
	}
	require.Equal(t, rows["x1"], testflow.KeyRow(t, b.db.Pool, "acct", "x1"), "the key the filter left out")

	human := b.cli(t, "keys", "bulk", "-scope", "acct", "-recovery-point", "reserve", "-yes", "release").ok(t).stdout
	require.Contains(t, human, "released 3 keys")
}

// TestCancelPausedHolder: `keys cancel` on a key whose holder is paused (SIGSTOP) in
// its call phase is refused without -force, changing nothing, and names the derived
// key to reconcile with; forced, it says before it acts that it cannot run the flow's
// compensation, and refuses until -skip-compensation (-dry-run only says so); then
// the answer is stored, the holder, continued, cannot
// commit (its call went out: the provider has it under the derived key), the answer is
// replayed byte for byte, and the sweeper leaves the key alone. A 5xx is refused.
func TestCancelPausedHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	h := startHolder(t, b, "paused")
	row := testflow.KeyRow(t, b.db.Pool, "acct", "paused")
	st := testflow.State(t, b.db.Pool, "acct", "paused")
	info, err := b.engine.InspectKey(ctx, "acct", "paused")
	require.NoError(t, err)
	body := `{"type":"about:blank","title":"cancelled","status":409}` + "\n"
	file := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
	args := []string{"keys", "cancel", "-status", "409", "-header", "Content-Type: application/problem+json", "-body-file", file}

	refused := b.cli(t, append(args, "acct", "paused")...)
	require.Equal(t, 1, refused.code)
	require.Contains(t, refused.stderr, "may have reached the remote side")
	require.Contains(t, refused.stderr, info.ID+":PHASE", "the derived keys to reconcile with")
	fiveXX := b.cli(t, "keys", "cancel", "-status", "503", "-force", "acct", "paused")
	require.Equal(t, 2, fiveXX.code)
	require.Contains(t, fiveXX.stderr, "5xx is never stored")
	require.Equal(t, 2, b.cli(t, "keys", "cancel", "acct", "paused").code, "-status is required")
	require.Equal(t, row, testflow.KeyRow(t, b.db.Pool, "acct", "paused"), "refusals change nothing")

	// The CLI registers no flow: it cannot run a compensation, nor tell whether the
	// flow declares one, and says so before it refuses.
	unknown := b.cli(t, append(args, "-force", "acct", "paused")...)
	require.Equal(t, 1, unknown.code)
	require.Contains(t, unknown.stdout, `cancel key "paused" in scope "acct", flow "charge3" at recovery point "reserve": refused: flow "charge3" is not registered here`)
	require.Contains(t, unknown.stderr, "nothing changed")
	require.Contains(t, unknown.stderr, "skip the compensation")
	dry := b.cli(t, append(args, "-force", "-skip-compensation", "-dry-run", "acct", "paused")...).ok(t).stdout
	require.Contains(t, dry, `: no compensation (skipped): the writes of the phases committed up to recovery point "reserve" stay`)
	require.NotContains(t, dry, "cancelled key")
	require.Equal(t, row, testflow.KeyRow(t, b.db.Pool, "acct", "paused"), "refusals and a dry run change nothing")

	out := b.cli(t, append(args, "-force", "-skip-compensation", "acct", "paused")...).ok(t).stdout
	require.Contains(t, out, "no compensation (skipped)")
	require.Contains(t, out, `cancelled key "paused" in scope "acct": answers 409`)
	require.Equal(t, st.LockVersion+1, testflow.State(t, b.db.Pool, "acct", "paused").LockVersion)

	require.Equal(t, "lease_lost", h.resume(t), "the holder's commit is fenced")
	require.Equal(t, testflow.Effects{Ledger: 1}, mustEffects(t, b, "paused"), "the holder settled nothing")
	require.Equal(t, 1, b.provider.Made(), "its call went out: the operator reconciles it by "+info.ID+":pay")
	require.Zero(t, sweepOnce(t, b), "the sweeper leaves a cancelled key alone")
	for range 2 {
		res, err := b.engine.Do(ctx, req("acct", "paused", 9))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 409, res.Response.Status)
		require.Equal(t, body, string(res.Response.Body), "byte for byte")
		require.Equal(t, []string{"application/problem+json"}, res.Response.Header["Content-Type"])
	}
	show := b.cli(t, "keys", "show", "acct", "paused").ok(t).stdout
	require.Regexp(t, `(?m)^response status:\s+409$`, show)
	require.Regexp(t, `(?m)^response headers:\s+Content-Type: application/problem\+json$`, show)
	require.Contains(t, show, "operator_cancelled")
}
