package keytable_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The hot statements on the partitioned layout (docs/PARTITIONS.md), to compare with
// BenchmarkLookup and BenchmarkAdvance: a table partitioned by the day with the
// default week ahead, through a Store that has not learnt the layout, so each
// statement names the key table and PostgreSQL prunes to the partition.
//
//	go test -run '^$' -bench 'Partitioned(Lookup|Advance)$' -benchtime 2000x ./internal/keytable/

// benchConnPartitioned is benchConn on a key table partitioned by the day.
func benchConnPartitioned(b *testing.B) *pgtest.DB {
	b.Helper()
	db := pgtest.New(b)
	require.NoError(b, keytable.New().SetupPartitioned(context.Background(), db.Pool, keytable.PartitionDay, 0))
	return db
}

func BenchmarkPartitionedLookup(b *testing.B) {
	ctx := context.Background()
	db := benchConnPartitioned(b)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	st := keytable.New()
	c := benchClaim()
	claimFor(b, conn, c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.Lookup(ctx, conn, c.Scope, c.Key); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPartitionedAdvance(b *testing.B) {
	ctx := context.Background()
	db := benchConnPartitioned(b)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	st := keytable.New()
	c := benchClaim()
	f := keytable.Fence{Scope: c.Scope, Key: c.Key, ID: c.ID, LockVersion: 1, CreatedAt: claimFor(b, conn, c)}
	b.ReportAllocs()
	for b.Loop() {
		_, err := sendTx(ctx, conn, st, keytable.KeyWrite{Fence: f, RecoveryPoint: "create_charge", Data: []byte(`{"charge_id":"ch_1"}`), Lease: time.Minute}, true)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPartitionedLookupAfterDetach is what a fresh request's look-up costs on a
// connection right after a partition was detached elsewhere, beside the same look-up
// in the steady state, by the number of attached partitions. A detach (or an attach)
// invalidates every backend's plans on the key table, so each connection's next
// statement that names it, the look-up of a new key among them, is planned again, for
// every partition: the floor under the requests that overlap a removal
// (docs/BENCHMARKS.md). The key is in no partition, as a new key is; each iteration of
// after-detach detaches the oldest partition and attaches it again (plain DETACH: its
// invalidation is the concurrent one's) before the timed look-up.
//
//	go test -run '^$' -bench PartitionedLookupAfterDetach -benchtime 50x ./internal/keytable/
func BenchmarkPartitionedLookupAfterDetach(b *testing.B) {
	for _, parts := range []int{9, 38, 98} {
		for _, detach := range []bool{false, true} {
			name := fmt.Sprintf("partitions=%d/steady", parts)
			if detach {
				name = fmt.Sprintf("partitions=%d/after-detach", parts)
			}
			b.Run(name, func(b *testing.B) { benchLookupAfterDetach(b, parts, detach) })
		}
	}
}

func benchLookupAfterDetach(b *testing.B, parts int, detach bool) {
	ctx := context.Background()
	db := benchConnPartitioned(b)
	var have int
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass`).Scan(&have))
	today := time.Now().UTC().Truncate(24 * time.Hour)
	var oldest string
	var oldestFrom time.Time
	for i := 1; have < parts || oldest == ""; i++ {
		oldestFrom = today.AddDate(0, 0, -i)
		oldest = keytable.PartitionName(oldestFrom, keytable.PartitionDay)
		_, err := db.Pool.Exec(ctx, `CREATE TABLE `+oldest+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
		require.NoError(b, err)
		require.NoError(b, attachDay(ctx, db, oldest, oldestFrom))
		have++
	}
	require.Equal(b, parts, have, "partitions attached")
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	st := keytable.New()
	_, err = st.CheckPartitions(ctx, conn) // what an engine does as it starts
	require.NoError(b, err)
	for range 8 { // past pgx's preparation and the server's custom plans
		_, err := st.Lookup(ctx, conn, "bench", "absent")
		require.ErrorIs(b, err, keytable.ErrNotFound)
	}
	for b.Loop() {
		if detach {
			b.StopTimer()
			_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys DETACH PARTITION `+oldest)
			require.NoError(b, err)
			require.NoError(b, attachDay(ctx, db, oldest, oldestFrom))
			b.StartTimer()
		}
		if _, err := st.Lookup(ctx, conn, "bench", "absent"); !errors.Is(err, keytable.ErrNotFound) {
			b.Fatal(err)
		}
	}
}

// attachDay attaches table as the day partition that begins at from.
func attachDay(ctx context.Context, db *pgtest.DB, table string, from time.Time) error {
	_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys ATTACH PARTITION `+table+` FOR VALUES FROM ('`+
		from.Format(time.RFC3339)+`') TO ('`+from.AddDate(0, 0, 1).Format(time.RFC3339)+`')`)
	return err
}
