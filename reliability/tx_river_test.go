package reliability

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/tenants"
)

// This test lives in the reliability module, not beside workflow's other tests of a
// transaction's end (workflow/tx_test.go), so that River stays out of the library's
// go.mod.

// TestTxEndsWithPhaseRiver: a River client inserting a job with InsertTx in a tx
// phase (the outbox of the charges example) commits the job with the phase; a client
// that kept the phase's pgx.Tx and inserts with it after the phase gets
// phases.ErrTxDone, and no job lands in tenant b's transaction. River reads the
// connection's settings through the transaction's Config, not Conn, so the connection
// goes back to the pool.
func TestTxEndsWithPhaseRiver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	migrator, err := rivermigrate.New(riverpgxv5.New(s.DB.Pool), nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	client, err := river.NewClient(riverpgxv5.New(s.Pool), &river.Config{})
	require.NoError(t, err)

	var kept pgx.Tx
	s.Phase["a"] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
		kept = tx.(pgx.Tx)
		if _, err := client.InsertTx(ctx, kept, outboxArgs{Note: "a"}, nil); err != nil {
			return nil, err
		}
		return tenants.Created(ctx, tx)
	}
	res, err := s.Engine.Do(ctx, tenants.Req("a"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)

	s.WhileBHolds(t, func() {
		_, err := client.InsertTx(ctx, kept, outboxArgs{Note: "a-late"}, nil)
		require.ErrorIs(t, err, phases.ErrTxDone)
	})
	rows, err := s.DB.Pool.Query(ctx, `SELECT args->>'note' FROM river_job ORDER BY id`)
	require.NoError(t, err)
	jobs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, jobs, "the phase's job committed with it; the late one nowhere")
	require.Equal(t, []string{"a", "b"}, s.Notes(t))
	require.EqualValues(t, 1, s.Pool.Stat().NewConnsCount(), "River did not take the connection with Conn: it went back to the pool")
}

type outboxArgs struct {
	Note string `json:"note"`
}

func (outboxArgs) Kind() string { return "outbox_note" }
