package keytable

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// BenchmarkFinishHistory is the pipelined finish (sqlPipeFinish) with today's history
// append and with the previous releases' (prevHistoryAppend), interleaved finish by
// finish on one warm connection, each alone in its transaction: it reports the median
// time of each in the server's executor, as EXPLAIN ANALYZE reads it (prev-µs and
// now-µs per finish; the commit's WAL flush is in neither), and their ratio. The rows are
// the charges flow's as the finish finds them: an unfinished row with its request body
// and a history of entries (sub-benchmark) out of a bound of 20.
//
//	go test -run '^$' -bench FinishHistory -benchtime 4000x ./internal/keytable/
func BenchmarkFinishHistory(b *testing.B) {
	for _, c := range []struct {
		name    string
		entries int
	}{{"Empty", 0}, {"Full", 20}} {
		b.Run(c.name, func(b *testing.B) { benchFinishHistory(b, c.entries) })
	}
}

func benchFinishHistory(b *testing.B, entries int) {
	ctx := context.Background()
	db := pgtest.New(b)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	texts := [2]string{strings.Replace(sqlPipeFinish, historyAppend("9", "10"), prevHistoryAppend("9", "10"), 1), sqlPipeFinish}
	require.NotEqual(b, texts[0], texts[1])
	headers := []byte(`{"Location": ["/v1/charges/ch_63924d37aac84cfe968addb2402bc60d"], "Content-Type": ["application/json"]}`)
	body := []byte(strings.Repeat("x", 150))
	entry := []byte(`[{"by": "client", "ms": 15, "from": "started", "phases": ["create_charge", "provider_charge", "finalize"], "attempt": 1, "outcome": "finished"}]`)
	var spent [2][]time.Duration
	var rows []benchRow
	next := 0
	for b.Loop() {
		if len(rows) == 0 {
			rows = benchRows(b, conn.Conn(), next, 1000, entries)
			next += 1000
		}
		r := rows[0]
		rows = rows[1:]
		i := (next + len(rows)) % 2 // alternate the two texts, finish by finish
		spent[i] = append(spent[i], explainedFinish(b, conn.Conn(), texts[i], "bench", r.key, r.id, 1, r.created, 201, headers, body, entry, 20))
	}
	if len(spent[0]) > 0 && len(spent[1]) > 0 {
		prev, now := median(spent[0]), median(spent[1])
		b.ReportMetric(prev, "prev-µs/finish")
		b.ReportMetric(now, "now-µs/finish")
		b.ReportMetric(now/prev, "now/prev")
	}
}

// median is the median of ds in microseconds.
func median(ds []time.Duration) float64 {
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Nanoseconds()) / 1000
}

// explainedFinish runs the finish sql with args under EXPLAIN ANALYZE and returns its
// execution time, after checking that it updated one row.
func explainedFinish(b *testing.B, conn *pgx.Conn, sql string, args ...any) time.Duration {
	rows, err := conn.Query(context.Background(), `EXPLAIN (ANALYZE, TIMING OFF, SUMMARY) `+sql, args...)
	require.NoError(b, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	plan := strings.Join(lines, "\n")
	require.Contains(b, plan, "(actual rows=1 loops=1)\n        Index Cond", "the finish found its row")
	var ms float64
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "Execution Time: "); ok {
			_, err := fmt.Sscanf(rest, "%f ms", &ms)
			require.NoError(b, err)
		}
	}
	require.Positive(b, ms, plan)
	return time.Duration(ms * float64(time.Millisecond))
}

type benchRow struct {
	key, id string
	created time.Time
}

// benchRows inserts n unfinished rows of the charges flow's shape, keys from first,
// each with a history of entries entries, and returns them.
func benchRows(b *testing.B, conn *pgx.Conn, first, n, entries int) []benchRow {
	rows, err := conn.Query(context.Background(), `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route,
	fingerprint, request_body, recovery_point, phase_data, locked_until, history)
SELECT 'bench', 'k' || g, gen_random_uuid(), 'create_charge', 'POST', '/v1/charges',
	'\x02'::bytea || sha256(g::text::bytea), convert_to(repeat('b', 90), 'UTF8'), 'charge_created',
	'{"charge_id": "ch_63924d37aac84cfe968addb2402bc60d"}', now() + interval '1 hour', $3::jsonb
FROM generate_series($1::int, $1::int + $2::int - 1) g
RETURNING idempotency_key, id::text, created_at`, first, n, historyOf(entries))
	require.NoError(b, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (benchRow, error) {
		var x benchRow
		return x, r.Scan(&x.key, &x.id, &x.created)
	})
	require.NoError(b, err)
	return out
}
