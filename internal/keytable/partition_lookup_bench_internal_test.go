package keytable

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// BenchmarkLookupAhead is the price of a look-up that does not read the clock
// (docs/PARTITIONS.md, "A clock that steps back"): the partitioned look-up as it is
// (ClockFree), which reads the partitions ahead (empty) before the current one,
// against the same with the clock filter it had before (Clock), which pruned them;
// the plain look-up (Unordered) and the pipelined claim's absence check (Absent), which
// never read the clock either. Partitions of a day and of an hour, with the default
// week ahead; a key in the current partition (a replay's look-up) and a key in none
// (a new key's look-up under the claim lock).
//
//	go test -run '^$' -bench LookupAhead -benchtime 300x ./internal/keytable/
func BenchmarkLookupAhead(b *testing.B) {
	for _, w := range []struct {
		name  string
		width time.Duration
	}{{"Day", PartitionDay}, {"Hour", PartitionHour}} {
		b.Run(w.name, func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			s := New()
			require.NoError(b, s.SetupPartitioned(ctx, db.Pool, w.width, 0))
			_, err := s.CheckPartitions(ctx, db.Pool)
			require.NoError(b, err)
			_, err = db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, locked_until)
VALUES ('s', 'recent', gen_random_uuid(), 'f', 'POST', '/r', sha256('req'), '{}', NULL)`)
			require.NoError(b, err)
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(b, err)
			defer conn.Release()
			clock := strings.Replace(s.sql.lookupPartitioned, "\nORDER BY", "\n\tAND created_at <= statement_timestamp()\nORDER BY", 1)
			require.NotEqual(b, clock, s.sql.lookupPartitioned)
			for _, l := range []struct{ name, sql string }{{"Clock", clock}, {"ClockFree", s.sql.lookupPartitioned},
				{"Unordered", s.sql.lookup}, {"Absent", `SELECT NOT EXISTS (SELECT FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2)`}} {
				for _, key := range []string{"recent", "missing"} {
					b.Run(l.name+"/"+key, func(b *testing.B) {
						for b.Loop() {
							rows, err := conn.Query(ctx, l.sql, "s", key)
							if err != nil {
								b.Fatal(err)
							}
							rows.Close()
							if rows.Err() != nil {
								b.Fatal(rows.Err())
							}
						}
					})
				}
			}
		})
	}
}
