package keytable

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// BenchmarkPartitionedClaimTx is a new key's first transaction as the Go-code claim
// at READ COMMITTED sends it, without the phase's own statements: BEGIN with the claim
// lock and the look-up under it, then the key row's insert with COMMIT. Sides: the
// plain key table (Plain); a week-partitioned one (5 weeks back, the current, the
// default week ahead) with the insert through the key table (Parent, as sent today)
// and to the current partition by name (ByName). Each op is one new key; ns/op is
// the client's wall time on one connection, the server's CPU included.
//
//	go test -run '^$' -bench PartitionedClaimTx -benchtime 3000x ./internal/keytable/
func BenchmarkPartitionedClaimTx(b *testing.B) {
	for _, side := range []string{"Plain", "Parent", "ByName"} {
		b.Run(side, func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			s := New()
			if side != "Plain" {
				require.NoError(b, s.SetupPartitioned(ctx, db.Pool, PartitionWeek, 0))
				_, err := db.Pool.Exec(ctx, `SELECT 1`)
				require.NoError(b, err)
				for i := 1; i <= 5; i++ { // five past weeks, as a 30-day retention keeps
					lo := time.Now().UTC().Truncate(PartitionWeek).Add(-time.Duration(i) * PartitionWeek)
					_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF idemflow_keys FOR VALUES FROM ('%s') TO ('%s')`,
						partitionName(lo, PartitionWeek), lo.Format(time.RFC3339), lo.Add(PartitionWeek).Format(time.RFC3339)))
					require.NoError(b, err)
				}
				_, err = s.CheckPartitions(ctx, db.Pool)
				require.NoError(b, err)
			}
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(b, err)
			defer conn.Release()
			id := 0
			b.ReportAllocs()
			for b.Loop() {
				id++
				c := Claim{Scope: "s", Key: fmt.Sprintf("k%d", id), ID: "0190b1a4-7d2c-7000-8000-" + fmt.Sprintf("%012d", id),
					Flow: "f", Method: "POST", Route: "/r", Fingerprint: []byte("fp"), Body: []byte("{}"), Lease: time.Minute}
				claimTx(ctx, b, conn.Conn(), s, c, side == "ByName")
			}
		})
	}
}

// claimTx sends the two round trips of a Go-code claim's transaction.
func claimTx(ctx context.Context, b *testing.B, conn *pgx.Conn, s *Store, c Claim, byName bool) {
	bt := &pgx.Batch{}
	bt.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	look := s.QueueClaimLook(bt, c)
	br := conn.SendBatch(ctx, bt)
	if _, err := br.Exec(); err != nil {
		b.Fatal(err)
	}
	locked, at, _, err := look.Read(br)
	if !locked || err == nil {
		b.Fatalf("claim: locked %v, err %v", locked, err)
	}
	if err := br.Close(); err != nil {
		b.Fatal(err)
	}
	sql := s.sql.insertKey
	if byName {
		name := s.partitionOf(at)
		require.NotEmpty(b, name)
		sql = strings.Replace(sql, "INSERT INTO "+s.part.table+" ", "INSERT INTO "+s.part.ident(name)+" ", 1)
		require.NotEqual(b, s.sql.insertKey, sql)
	}
	bt = &pgx.Batch{}
	bt.Queue(sql, c.Scope, c.Key, c.ID, c.Flow, c.Method, c.Route, c.Fingerprint, c.Body, "started", []byte("{}"), int64(60000), nil)
	bt.Queue("COMMIT")
	if err := conn.SendBatch(ctx, bt).Close(); err != nil {
		b.Fatal(err)
	}
}
