package keytable_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

func claim(scope, key, id string) keytable.Claim {
	fp := sha256.Sum256([]byte("req"))
	return keytable.Claim{Scope: scope, Key: key, ID: id, Flow: "f", Method: "POST", Route: "/r",
		Fingerprint: fp[:], Body: []byte(`{}`), Lease: time.Minute}
}

// tryClaim commits a claim on its own: the claim lock and the insert in one statement.
func tryClaim(t *testing.T, db *pgtest.DB, c keytable.Claim) error {
	t.Helper()
	st := keytable.New()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	q := st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte(`{}`)})
	b.Queue("COMMIT")
	br := db.Pool.SendBatch(context.Background(), b)
	defer br.Close()
	_, err := br.Exec()
	require.NoError(t, err)
	if _, err := q.Read(br); err != nil {
		return err
	}
	_, err = br.Exec()
	require.NoError(t, err)
	return nil
}

// finish sends the fenced finish on its own, as the engine queues it.
func finish(ctx context.Context, db *pgtest.DB, f keytable.Fence, resp keytable.StoredResponse) error {
	st := keytable.New()
	b := &pgx.Batch{}
	q := st.QueueKeyWrite(b, keytable.KeyWrite{Fence: f, Response: &resp})
	br := db.Pool.SendBatch(ctx, b)
	_, err := q.Read(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// createdAt is the created_at of the key row (scope, key): the last part of its fence.
func createdAt(t *testing.T, db *pgtest.DB, scope, key string) time.Time {
	t.Helper()
	row, err := keytable.New().Lookup(context.Background(), db.Pool, scope, key)
	require.NoError(t, err)
	return row.CreatedAt
}

// claimNow commits a claim that must succeed, and returns the row.
func claimNow(t *testing.T, db *pgtest.DB, c keytable.Claim) *keytable.Row {
	t.Helper()
	require.NoError(t, tryClaim(t, db, c))
	row, err := keytable.New().Lookup(context.Background(), db.Pool, c.Scope, c.Key)
	require.NoError(t, err)
	return row
}

func TestStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	const id1, id2, idOther = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"

	first := claimNow(t, db, claim("s1", "k", id1))
	require.Equal(t, id1, first.ID)
	require.EqualValues(t, 1, first.LockVersion)
	require.True(t, first.LeaseLive)
	require.Greater(t, first.LeaseLeft(), 50*time.Second)

	require.ErrorIs(t, tryClaim(t, db, claim("s1", "k", id2)), keytable.ErrClaimExists, "the second claim finds the first row")
	again, err := st.Lookup(ctx, db.Pool, "s1", "k")
	require.NoError(t, err)
	require.Equal(t, id1, again.ID, "and changes nothing")

	other := claimNow(t, db, claim("s2", "k", idOther))
	require.Equal(t, idOther, other.ID, "the same key in another scope is another row")

	t.Run("ClaimBusyWhileAnotherHoldsTheLock", func(t *testing.T) {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		var locked bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)`, keytable.ClaimHash("s3", "k")).Scan(&locked))
		require.True(t, locked)
		require.ErrorIs(t, tryClaim(t, db, claim("s3", "k", id2)), keytable.ErrClaimBusy)
		_, err = st.Lookup(ctx, db.Pool, "s3", "k")
		require.ErrorIs(t, err, keytable.ErrNotFound, "a busy claim writes nothing")
	})

	f := keytable.Fence{Scope: "s1", Key: "k", ID: id1, LockVersion: 1, CreatedAt: createdAt(t, db, "s1", "k")}

	t.Run("TakeoverRefusesALiveLease", func(t *testing.T) {
		_, err := st.Takeover(ctx, db.Pool, f, time.Minute, 0)
		require.ErrorIs(t, err, keytable.ErrNotTaken)
	})

	t.Run("AdvanceIsFenced", func(t *testing.T) {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		b := &pgx.Batch{}
		stale := f
		stale.LockVersion = 7
		q := st.QueueKeyWrite(b, keytable.KeyWrite{Fence: stale, RecoveryPoint: "one", Data: []byte(`{}`), Lease: time.Minute})
		br := tx.SendBatch(ctx, b)
		_, err = q.Read(br)
		require.ErrorIs(t, err, keytable.ErrLeaseLost)
		require.Error(t, br.Close())
	})

	t.Run("ReleaseThenTakeover", func(t *testing.T) { releaseThenTakeover(t, db, st, f) })

	t.Run("OtherScopeUntouched", func(t *testing.T) {
		row, err := st.Lookup(ctx, db.Pool, "s2", "k")
		require.NoError(t, err)
		require.EqualValues(t, 1, row.LockVersion)
		require.Equal(t, keytable.StatusInProgress, row.Status)
		_, err = st.Lookup(ctx, db.Pool, "s3", "k")
		require.ErrorIs(t, err, keytable.ErrNotFound)
	})

	// A 5xx is never stored. Since migration 004 no CHECK constraint says so: the table's
	// writer refuses it (the fenced write raises in its place, aborting the transaction;
	// the cancel refuses before any SQL), and the row stays as it was.
	t.Run("FiveHundredRefusedBeforeTheWrite", func(t *testing.T) {
		fo := keytable.Fence{Scope: "s2", Key: "k", ID: idOther, LockVersion: 1, CreatedAt: createdAt(t, db, "s2", "k")}
		fiveHundred := keytable.StoredResponse{Status: 503, Headers: []byte(`{}`), Body: []byte("x")}
		require.ErrorIs(t, finish(ctx, db, fo, fiveHundred), keytable.ErrInvalid)
		cancel := keytable.Cancel{ID: idOther, LockVersion: 1, RecoveryPoint: "started", CreatedAt: fo.CreatedAt, Response: fiveHundred}
		require.ErrorIs(t, st.CancelKey(ctx, db.Pool, "s2", "k", cancel), keytable.ErrInvalid)

		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		b := &pgx.Batch{}
		q := st.QueueKeyWrite(b, keytable.KeyWrite{Fence: fo, Cancel: &cancel})
		br := tx.SendBatch(ctx, b)
		_, err = q.Read(br)
		require.ErrorIs(t, err, keytable.ErrInvalid, "the compensation's fenced cancel")
		require.Error(t, br.Close())

		row, err := st.Lookup(ctx, db.Pool, "s2", "k")
		require.NoError(t, err)
		require.Equal(t, keytable.StatusInProgress, row.Status, "nothing changed")
		require.EqualValues(t, 1, row.LockVersion)
	})
}

// releaseThenTakeover is TestStatements' step on the first key: released (twice, under
// one lease), taken over (not by a stale view), refused to the old lock version, and
// finished once by the new one.
func releaseThenTakeover(t *testing.T, db *pgtest.DB, st *keytable.Store, f keytable.Fence) {
	ctx := context.Background()
	require.NoError(t, st.Release(ctx, db.Pool, f, keytable.Release{RecoveryPoint: "one", Data: []byte(`{"a":1}`), LastError: "boom", Stored: "started"}))
	require.NoError(t, st.Release(ctx, db.Pool, f, keytable.Release{RecoveryPoint: "one", Data: []byte(`{}`), LastError: "again", Stored: "one"}), "releasing twice under the same lease is harmless")
	row, err := st.Lookup(ctx, db.Pool, "s1", "k")
	require.NoError(t, err)
	require.False(t, row.LeaseLive)
	require.Equal(t, "one", row.RecoveryPoint)
	require.Equal(t, "again", *row.LastError)

	stale := f
	stale.LockVersion = 5
	_, err = st.Takeover(ctx, db.Pool, stale, time.Minute, 0)
	require.ErrorIs(t, err, keytable.ErrNotTaken, "a stale view of the row takes nothing")
	taken, err := st.Takeover(ctx, db.Pool, f, time.Minute, 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, taken.LockVersion)
	require.Equal(t, 2, taken.Attempts)
	require.ErrorIs(t, st.Release(ctx, db.Pool, f, keytable.Release{RecoveryPoint: "one", Data: []byte(`{}`), LastError: "zombie", Stored: "one"}), keytable.ErrLeaseLost,
		"the old lock version can no longer release")

	f2 := f
	f2.LockVersion = 2
	require.NoError(t, finish(ctx, db, f2, keytable.StoredResponse{Status: 201, Headers: []byte(`{}`), Body: []byte("ok")}))
	require.ErrorIs(t, finish(ctx, db, f2, keytable.StoredResponse{Status: 201, Headers: []byte(`{}`), Body: []byte("twice")}), keytable.ErrLeaseLost)
	row, err = st.Lookup(ctx, db.Pool, "s1", "k")
	require.NoError(t, err)
	require.Equal(t, keytable.StatusFinished, row.Status)
	require.Equal(t, []byte("ok"), row.ResponseBody)
	require.Equal(t, 201, *row.ResponseStatus)
}

// TestReleaseNeverMovesBack: a release matches only while the row holds the recovery
// point the executor last knew durable. A commit the executor could not confirm (it was
// still running when the executor read the row) may have advanced the row after all:
// the release must not put the old recovery point back.
func TestReleaseNeverMovesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	const id = "00000000-0000-4000-8000-0000000000aa"
	f := claimNow(t, db, claim("s", "k", id)).Fence()

	// The commit the executor lost track of: it advanced the row to "one".
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	q := st.QueueKeyWrite(b, keytable.KeyWrite{Fence: f, RecoveryPoint: "one", Data: []byte(`{"n":1}`), Lease: time.Minute})
	br := tx.SendBatch(ctx, b)
	_, err = q.Read(br)
	require.NoError(t, err)
	require.NoError(t, br.Close())
	require.NoError(t, tx.Commit(ctx))
	rowText := func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = 's' AND idempotency_key = 'k'`).Scan(&s))
		return s
	}
	before := rowText()

	err = st.Release(ctx, db.Pool, f, keytable.Release{RecoveryPoint: "started", Data: []byte(`{}`), LastError: "unknown", Stored: "started"})
	require.ErrorIs(t, err, keytable.ErrLeaseLost, "the row is past what the releaser knew")
	require.Equal(t, before, rowText(), "a refused release changes nothing")

	require.ErrorIs(t, st.DeadLetter(ctx, db.Pool, f, keytable.DeadLetter{RecoveryPoint: "started", Data: []byte(`{}`), LastError: "x", Stored: "started"}), keytable.ErrLeaseLost)
	require.NoError(t, st.Release(ctx, db.Pool, f, keytable.Release{RecoveryPoint: "one", Data: []byte(`{"n":1}`), LastError: "later", Stored: "one"}))
}
