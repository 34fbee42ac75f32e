package keytable

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPartitionLookupRecent: the look-up before a claim reads the current partition
// alone outside a transaction (a key in an older partition is not found there), and is
// Lookup in a transaction.
func TestPartitionLookupRecent(t *testing.T) {
	t.Parallel()
	db, s, _ := addressedTable(t)
	ctx := context.Background()
	row, err := s.LookupRecent(ctx, db.Pool, "s", "new")
	require.NoError(t, err)
	require.Equal(t, "new", row.Key)
	_, err = s.LookupRecent(ctx, db.Pool, "s", "old")
	require.ErrorIs(t, err, ErrNotFound, "an older partition is the claim's to look in")
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	row, err = s.LookupRecent(ctx, tx, "s", "old")
	require.NoError(t, err, "in a transaction: every partition")
	require.Equal(t, "old", row.Key)
}

// TestPartitionClaimInsertChecks: on a partitioned key table the claim that inserts
// without a look-up first refuses a key whose row is in an older partition
// (ErrClaimExists: the primary key of the plain layout would have, and there is none
// here), refuses a key whose claim lock another transaction holds (ErrClaimBusy), and
// inserts a new key, returning its created_at; nothing is inserted by a refused one.
func TestPartitionClaimInsertChecks(t *testing.T) {
	t.Parallel()
	db, s, _ := addressedTable(t)
	ctx := context.Background()
	claim := func(key string) error {
		c := Claim{Scope: "s", Key: key, ID: newID(t, db.Pool), Flow: "f", Method: "POST", Route: "/r",
			Fingerprint: make([]byte, 32), Body: []byte(`{}`), Lease: 0}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		b := &pgx.Batch{}
		q := s.QueueKeyWrite(b, KeyWrite{Claim: &c, RecoveryPoint: "one", Data: []byte(`{}`)})
		br := tx.SendBatch(ctx, b)
		at, err := q.Read(br)
		_ = br.Close()
		if err != nil {
			return err
		}
		require.False(t, at.IsZero())
		return tx.Commit(ctx)
	}
	require.ErrorIs(t, claim("old"), ErrClaimExists)

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, s.sql.claimLock, claimHash("s", "held"))
	require.NoError(t, err)
	require.ErrorIs(t, claim("held"), ErrClaimBusy)
	require.NoError(t, holder.Rollback(ctx))

	require.NoError(t, claim("fresh"))
	rows := map[string]int{}
	r, err := db.Pool.Query(ctx, `SELECT idempotency_key, count(*)::int FROM idemflow_keys GROUP BY 1`)
	require.NoError(t, err)
	for r.Next() {
		var k string
		var n int
		require.NoError(t, r.Scan(&k, &n))
		rows[k] = n
	}
	require.NoError(t, r.Err())
	require.Equal(t, map[string]int{"new": 1, "old": 1, "fresh": 1}, rows)
}
