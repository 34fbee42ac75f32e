package keytable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The hot statements on the partitioned layout (docs/PARTITIONS.md), to compare with
// BenchmarkLookup and BenchmarkAdvance: a table partitioned by the day with the
// default week ahead. Per-key statements do not name the row's partition yet, so each
// probes every partition.
//
//	go test -run '^$' -bench 'Lookup|Advance' -benchtime 2000x ./store/

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
