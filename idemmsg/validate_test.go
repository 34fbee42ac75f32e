package idemmsg_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// TestControlCharactersTerminate: a message whose scope or key holds a C0 or C1
// control character or DEL is terminated with workflow.ErrControlCharacter, and
// nothing is written.
func TestControlCharactersTerminate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	for _, bad := range []string{"m\x00", "m\x1b[1m", "m\x7f", "m\u0085", "m\u009b1m"} {
		for _, m := range []idemmsg.Message{
			{Scope: bad, Key: "m1", Flow: testflow.Name, Payload: []byte(`{"amount":7}`)},
			{Scope: "consumer", Key: bad, Flow: testflow.Name, Payload: []byte(`{"amount":7}`)},
		} {
			d := idemmsg.Handle(ctx, e, m)
			require.Equal(t, idemmsg.Terminate, d.Action, "%q/%q", m.Scope, m.Key)
			require.ErrorIs(t, d.Err, workflow.ErrControlCharacter, "%q/%q", m.Scope, m.Key)
		}
	}
	require.Zero(t, testflow.CountKeys(t, db.Pool), "no key row")
	var ledger int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&ledger))
	require.Zero(t, ledger, "no phase ran")
}
