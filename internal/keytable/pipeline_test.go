package keytable_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// pipeClaim sends, as one implicit transaction (no BEGIN, no COMMIT) unless begin is
// set, the pipelined claim of c on a plain key table: the claim lock, the key row's
// insert, and a statement of the phase's (a value of the sequence pipe_witness). It
// returns the error of the claim lock or of the insert.
func pipeClaim(t *testing.T, db *pgtest.DB, st *keytable.Store, c keytable.Claim, begin string) error {
	t.Helper()
	ctx := context.Background()
	b := &pgx.Batch{}
	if begin != "" {
		b.Queue(begin)
	}
	head := st.QueueHead(b, keytable.Head{Claim: &c, InsertFollows: true})
	write := st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, Held: true, RecoveryPoint: "first", Data: []byte(`{}`)})
	b.Queue(`SELECT nextval('pipe_witness')`)
	if begin != "" {
		b.Queue("COMMIT")
	}
	br := db.Pool.SendBatch(ctx, b)
	defer br.Close()
	if begin != "" {
		_, err := br.Exec()
		require.NoError(t, err)
	}
	if _, err := head.Read(br); err != nil {
		return err
	}
	if _, err := write.Read(br); err != nil {
		return err
	}
	_, err := br.Exec()
	require.NoError(t, err)
	return br.Close()
}

// TestPipeClaimInsert: on a plain key table the pipelined claim of a new key is the
// claim lock and the key row's insert; a second claim of the key raises at the insert
// (ErrClaimExists) and runs nothing after it. A transaction at another level than
// READ COMMITTED raises at the claim lock (ErrNotReadCommitted), before anything, and
// the Store asks for BEGIN from then on.
func TestPipeClaimInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(ctx, `CREATE SEQUENCE pipe_witness`)
	require.NoError(t, err)
	witness := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pipe_witness`).Scan(&n))
		return n
	}
	st := keytable.New()
	require.NoError(t, pipeClaim(t, db, st, claim("s", "k", pipeID()), ""))
	require.EqualValues(t, 1, witness())
	require.ErrorIs(t, pipeClaim(t, db, st, claim("s", "k", pipeID()), ""), keytable.ErrClaimExists)
	require.EqualValues(t, 1, witness(), "the loser ran nothing after its insert")
	require.False(t, st.SendExplicit())

	for _, iso := range []string{"REPEATABLE READ", "SERIALIZABLE"} {
		st := keytable.New()
		err := pipeClaim(t, db, st, claim("s", "iso "+iso, pipeID()), "BEGIN ISOLATION LEVEL "+iso)
		require.ErrorIs(t, err, keytable.ErrNotReadCommitted, iso)
		require.True(t, st.SendExplicit(), iso)
		require.EqualValues(t, 1, witness(), "%s: nothing ran after the claim lock", iso)
	}
	st = keytable.New()
	require.NoError(t, pipeClaim(t, db, st, claim("s", "rc", pipeID()), "BEGIN ISOLATION LEVEL READ COMMITTED"))
	require.False(t, st.SendExplicit())
}

// pipeID is a new key row id.
func pipeID() string {
	pipeIDs++
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", pipeIDs)
}

var pipeIDs int
