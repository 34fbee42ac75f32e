package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// controlCases are keys and scopes holding a C0 or C1 control character or DEL, each
// as a Go string of the bytes a client would send. C1 characters are two bytes in
// UTF-8 (U+009B, the one-byte CSI, is \xc2\x9b).
var controlCases = []struct{ name, s string }{
	{"NUL", "a\x00b"}, {"Bell", "a\x07b"}, {"Newline", "a\nb"}, {"Escape", "a\x1b[31mb"},
	{"Unit", "a\x1fb"}, {"DEL", "a\x7fb"}, {"C1First", "a\u0080b"}, {"CSI", "a\u009b31mb"},
	{"C1Last", "a\u009fb"},
}

// TestControlCharactersRefusedBeforeAnySQL: a key or a scope with a control character
// is refused by Do with ErrControlCharacter (and ErrInvalidKey or ErrInvalidScope)
// before any statement reaches the database, and nothing is written.
func TestControlCharactersRefusedBeforeAnySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	sent := &roundTrips{}
	cfg.ConnConfig.Tracer = sent
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := b.newEngine(t, setupOpts{pool: pool})

	for _, c := range controlCases {
		t.Run("Scope"+c.name, func(t *testing.T) {
			require.ErrorIs(t, workflow.ValidateScope(c.s), workflow.ErrControlCharacter)
			_, err := e.Do(ctx, chargeReq(c.s, "k", `{"amount":1}`))
			require.ErrorIs(t, err, workflow.ErrInvalidScope)
			require.ErrorIs(t, err, workflow.ErrControlCharacter)
		})
		t.Run("Key"+c.name, func(t *testing.T) {
			require.ErrorIs(t, workflow.ValidateKey(c.s), workflow.ErrControlCharacter)
			_, err := e.Do(ctx, chargeReq("acct", c.s, `{"amount":1}`))
			require.ErrorIs(t, err, workflow.ErrInvalidKey)
			require.ErrorIs(t, err, workflow.ErrControlCharacter)
		})
	}
	require.Zero(t, sent.n.Load(), "no statement was sent")
	require.Zero(t, countKeys(t, b.db), "no key row")
	var charges int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&charges))
	require.Zero(t, charges, "no phase ran")

	// Text that is neither: non-ASCII letters and symbols own keys; keys stay ASCII.
	for _, scope := range []string{"café", "a b", "acct\u00a0x", "~!"} {
		require.NoError(t, workflow.ValidateScope(scope), "%q", scope)
	}
	require.NotErrorIs(t, workflow.ValidateScope("acct\xff"), workflow.ErrControlCharacter, "invalid UTF-8 is refused as such")
	require.ErrorIs(t, workflow.ValidateScope("acct\xc2"), workflow.ErrInvalidScope, "a C1 lead byte alone is not UTF-8")
	require.NotErrorIs(t, workflow.ValidateKey("cl\u00e9"), workflow.ErrControlCharacter)
}
