package payout_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/workflow"
)

// TestKeyAndScope: every id and account Parse accepts maps to a valid key and scope,
// the same every time, printable ids as they are, and no two distinct ones together.
func TestKeyAndScope(t *testing.T) {
	t.Parallel()
	ids := []string{
		"po_1", "po 1", "po_é", "po\u0001", "po\x7f", "po\u0085", "po\u009b31m", "\ufffd",
		"~1~abc", "~", "~1~" + strings.Repeat("A", 43), strings.Repeat("x", 200), strings.Repeat("é", 100),
		"po_1\n", "po_1\t", "\u0000",
	}
	keys := map[string]string{}
	scopes := map[string]string{}
	for _, id := range ids {
		k := payout.Key(id)
		require.NoError(t, workflow.ValidateKey(k), "%q -> %q", id, k)
		require.Equal(t, k, payout.Key(id), "deterministic")
		require.NotContains(t, keys, k, "%q and %q share the key %q", keys[k], id, k)
		keys[k] = id
		s := payout.Scope("payouts", id)
		require.NoError(t, workflow.ValidateScope(s), "%q -> %q", id, s)
		require.NotContains(t, scopes, s, "%q and %q share the scope %q", scopes[s], id, s)
		scopes[s] = id
	}
	require.Equal(t, "po_1", payout.Key("po_1"), "a printable id is its own key")
	require.Equal(t, "payouts/acct_1", payout.Scope("payouts", "acct_1"))
	require.Equal(t, "payouts/café", payout.Scope("payouts", "café"), "UTF-8 text is its own scope")
	require.True(t, strings.HasPrefix(payout.Key("po_é"), payout.EncodedPrefix))
	require.True(t, strings.HasPrefix(payout.Key("~1~abc"), payout.EncodedPrefix))
	require.NotEqual(t, "~1~abc", payout.Key("~1~abc"), "an id in the hashed form's shape is hashed too")
}
