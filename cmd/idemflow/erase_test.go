package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/testflow"
)

// TestKeysErasePausedHolder: `keys erase` refuses bad usage, counts without -yes (and
// fails, changing nothing), erases the finished and dead-lettered keys of the scope
// with -yes and leaves the one in progress, whose holder is paused (SIGSTOP); with
// -force it erases that one too, and the holder, continued, cannot commit (fenced) nor
// bring the row back. Another scope is untouched.
func TestKeysErasePausedHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for _, k := range []string{"f1", "f2"} {
		_, err := b.engine.Do(ctx, req("acct", k, 2))
		require.NoError(t, err)
	}
	deadKeys(t, b, "d1")
	_, err := b.engine.Do(ctx, req("other", "f1", 2))
	require.NoError(t, err)
	other := testflow.KeyRow(t, b.db.Pool, "other", "f1")
	h := startHolder(t, b, "paused")
	paused := testflow.KeyRow(t, b.db.Pool, "acct", "paused")
	count := func(scope string) int {
		t.Helper()
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = $1`, scope).Scan(&n))
		return n
	}

	for name, args := range map[string][]string{
		"no scope":   {"keys", "erase", "-yes"},
		"long scope": {"keys", "erase", "-yes", "-scope", strings.Repeat("s", 256)},
		"not UTF-8":  {"keys", "erase", "-yes", "-scope", "a\xffb"},
		"both":       {"keys", "erase", "-yes", "-dry-run", "-scope", "acct"},
		"argument":   {"keys", "erase", "-yes", "-scope", "acct", "extra"},
	} {
		require.Equal(t, 2, b.cli(t, args...).code, name)
	}
	require.Equal(t, 4, count("acct"), "bad usage changes nothing")

	unconfirmed := b.cli(t, "keys", "erase", "-scope", "acct")
	require.Equal(t, 1, unconfirmed.code)
	require.Contains(t, unconfirmed.stdout, `would erase 3 keys of scope "acct"`)
	require.Contains(t, unconfirmed.stdout, "1 keys in progress left")
	require.Contains(t, unconfirmed.stderr, "run again with -yes")
	dry := b.cli(t, "keys", "erase", "-json", "-force", "-dry-run", "-scope", "acct").ok(t).lines(t)
	require.EqualValues(t, 4, dry[0]["erased"])
	require.EqualValues(t, 1, dry[0]["fenced"])
	require.Equal(t, 4, count("acct"), "counting changes nothing")

	out := b.cli(t, "keys", "erase", "-yes", "-scope", "acct").ok(t).stdout
	require.Contains(t, out, `erased 3 keys of scope "acct"`)
	require.Contains(t, out, "1 keys in progress left")
	require.Equal(t, paused, testflow.KeyRow(t, b.db.Pool, "acct", "paused"), "the key in progress is left as it was")

	forced := b.cli(t, "keys", "erase", "-json", "-yes", "-force", "-scope", "acct").ok(t).lines(t)
	require.EqualValues(t, 1, forced[0]["erased"])
	require.EqualValues(t, 1, forced[0]["fenced"])
	require.Zero(t, count("acct"))

	require.Equal(t, "lease_lost", h.resume(t), "the holder's commit is fenced")
	require.Zero(t, count("acct"), "the holder brought no row back")
	require.Equal(t, testflow.Effects{Ledger: 1}, mustEffects(t, b, "paused"), "the holder settled nothing")
	require.Equal(t, other, testflow.KeyRow(t, b.db.Pool, "other", "f1"), "another scope is untouched")
}
