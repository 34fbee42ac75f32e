package keytable_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
	learnLayout(t, db, st)
	require.Equal(t, pgtest.CitusMode(), st.SendExplicit())

	for _, iso := range []string{"REPEATABLE READ", "SERIALIZABLE"} {
		st := keytable.New()
		err := pipeClaim(t, db, st, claim("s", "iso "+iso, pipeID()), "BEGIN ISOLATION LEVEL "+iso)
		require.ErrorIs(t, err, keytable.ErrNotReadCommitted, iso)
		require.True(t, st.SendExplicit(), iso)
		require.EqualValues(t, 1, witness(), "%s: nothing ran after the claim lock", iso)
	}
	st = keytable.New()
	require.NoError(t, pipeClaim(t, db, st, claim("s", "rc", pipeID()), "BEGIN ISOLATION LEVEL READ COMMITTED"))
	learnLayout(t, db, st)
	require.Equal(t, pgtest.CitusMode(), st.SendExplicit())
}

// learnLayout has st learn the key table's layout, as an engine does on its first
// connection.
func learnLayout(t *testing.T, db *pgtest.DB, st *keytable.Store) {
	t.Helper()
	_, err := st.CheckPartitions(context.Background(), db.Pool)
	if !errors.Is(err, keytable.ErrNotPartitioned) {
		require.NoError(t, err)
	}
}

// TestSendExplicitCitus: a Store sends pipelined transactions with BEGIN until it has
// learnt that the database has no citus extension (on Citus a pipeline without BEGIN
// is no transaction across nodes: a worker commits each statement routed to it on its
// own), by the engine's start-up check or by a sweep; on Citus, always. The second
// part shows why, on Citus: a worker's insert in a pipeline without BEGIN outlives the
// error of a later statement.
func TestSendExplicitCitus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	require.True(t, st.SendExplicit(), "unknown: the strictest case")
	learnLayout(t, db, st)
	require.Equal(t, pgtest.CitusMode(), st.SendExplicit(), "learnt by the start-up check")
	st = keytable.New()
	_, err := st.TakeDue(ctx, db.Pool, keytable.TakeDue{Limit: 1, Lease: time.Minute, Flows: []string{"f"}})
	require.NoError(t, err)
	require.Equal(t, pgtest.CitusMode(), st.SendExplicit(), "learnt by a sweep")

	c := claim("s", "k", pipeID())
	b := &pgx.Batch{}
	st.QueueHead(b, keytable.Head{Claim: &c, InsertFollows: true}) // a plain key table's, as the engine sends it
	st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, Held: true, RecoveryPoint: "first", Data: []byte(`{}`)})
	b.Queue(`SELECT 1/0`) // the phase's statement fails
	require.Error(t, db.Pool.SendBatch(ctx, b).Close())
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE idempotency_key = 'k'`).Scan(&n))
	want := 0
	if pgtest.CitusMode() {
		want = 1 // what SendExplicit prevents
	}
	require.Equal(t, want, n, "the key row after the implicit transaction failed")
}

// pipeID is a new key row id; parallel tests call it.
func pipeID() string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", pipeIDs.Add(1))
}

var pipeIDs atomic.Int64
