package keytable

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestTakeDueReadsWhatItTakes runs EXPLAIN ANALYZE of the takeover under its planner
// settings (sqlTakeDuePlan), on a backlog of due keys the table's statistics do not
// know of (as after an outage, before autovacuum analyzes): no node of the plan handles
// more rows than the statement takes, so a batch costs the same whatever the backlog.
// Without the settings the planner reads every due key with a bitmap scan and sorts
// them all, for every batch.
func TestTakeDueReadsWhatItTakes(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped on Citus: the coordinator's plan is a distributed one; TakeDue scans per key there (ScanPerKey)")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	const backlog, finished, limit = 2000, 20000, 5
	_, err := db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint,
			request_body, recovery_point, created_at, next_attempt_at)
		SELECT 's', 'k' || i, gen_random_uuid(), 'f', 'POST', '/r', sha256(('k' || i)::bytea), '{}'::bytea, 'started',
			statement_timestamp() - interval '1 hour', statement_timestamp() - i * interval '1 millisecond'
		FROM generate_series(1, $1::int) AS i`, backlog)
	require.NoError(t, err)
	// Traffic before the outage: keys claimed and finished, whose old row versions the
	// index of due keys still points to.
	_, err = db.Pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint,
			request_body, recovery_point, next_attempt_at)
		SELECT 's', 'done' || i, gen_random_uuid(), 'f', 'POST', '/r', sha256(('done' || i)::bytea), '{}'::bytea, 'started',
			statement_timestamp() - interval '2 hours'
		FROM generate_series(1, $1::int) AS i`, finished)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'finished', recovery_point = 'finished', response_status = 201,
		response_headers = '{}', response_body = '{}', finished_at = statement_timestamp() WHERE idempotency_key LIKE 'done%'`)
	require.NoError(t, err)

	for _, from := range []float64{0, 0.5, 0.999} { // the oldest first; from the middle and the end, wrapping around
		checkTakeDuePlan(t, db, s, limit, from)
	}
}

// checkTakeDuePlan runs EXPLAIN ANALYZE of the takeover of limit keys from start point
// from, rolled back, and checks that it took limit keys and that no node of its plan
// handled more.
func checkTakeDuePlan(t *testing.T, db *pgtest.DB, s *Store, limit int, from float64) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, sqlTakeDuePlan)
	require.NoError(t, err)
	var out []byte
	err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON, TIMING OFF, COSTS OFF) `+s.sql.takeDue,
		limit, 0, 60000, []string{"f"}, 10, nil, from).Scan(&out)
	require.NoError(t, err)
	var plan []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Len(t, plan, 1)
	t.Logf("plan from %v: %s", from, out)
	most := 0
	var walk func(n planNode)
	walk = func(n planNode) {
		most = max(most, n.ActualRows)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan[0].Plan)
	require.Equal(t, limit, plan[0].Plan.ActualRows, "the takeover from %v took its limit", from)
	require.LessOrEqual(t, most, limit, "a node of the takeover's plan from %v handled more rows than it takes", from)
}

// planNode is what TestTakeDueReadsWhatItTakes reads of a node of EXPLAIN's JSON.
type planNode struct {
	NodeType   string     `json:"Node Type"`
	ActualRows int        `json:"Actual Rows"`
	Plans      []planNode `json:"Plans"`
}
