package keytable_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The partitioned key table under live traffic, on whichever server the tests run:
// plain PostgreSQL (concurrent detach), or, with IDEMFLOW_TEST_CITUS=1, a Citus
// cluster, where the table is a distributed partitioned table and removal uses the
// plain detach bounded by a lock timeout (docs/PARTITIONS.md, "Citus 12.1"). It logs
// the stall of every removal and creation as the live requests saw it, and, on Citus,
// as the removal reports it (PartitionReport.Stall): the figures in docs/SCALING.md.

// liveRequest is one request of the traffic: when it started, how long it took.
type liveRequest struct {
	start time.Time
	took  time.Duration
}

// traffic is live requests on the key table: each claims a new key finished at once
// and then looks it up, and looks up the kept partition's unfinished key.
type traffic struct {
	mu   sync.Mutex
	done []liveRequest
	keys []string // "scope/key" of every claim that committed
	errs []error
	tick chan struct{} // a value after each request, when there is room
}

// await returns once the traffic has made n requests from now.
func (tr *traffic) await(n int) {
	for drained := false; !drained; {
		select {
		case <-tr.tick:
		default:
			drained = true
		}
	}
	for range n {
		<-tr.tick
	}
}

// run makes requests from worker until stop is closed.
func (tr *traffic) run(ctx context.Context, db *pgtest.DB, worker int, stop <-chan struct{}) {
	st := keytable.New()
	fp := sha256.Sum256([]byte("req"))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		scope, key := fmt.Sprintf("s%d", n%8), fmt.Sprintf("live-%d-%d", worker, n)
		c := keytable.Claim{Scope: scope, Key: key, ID: fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", worker, n),
			Flow: "f", Method: "POST", Route: "/r", Fingerprint: fp[:], Body: []byte(`{}`), Lease: time.Minute}
		start := time.Now()
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		q := st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, Response: &keytable.StoredResponse{Status: 200, Headers: []byte(`{}`), Body: []byte(`ok`)}})
		b.Queue("COMMIT")
		br := db.Pool.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			_, err = q.Read(br)
		}
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			_, err = st.Lookup(ctx, db.Pool, scope, key)
		}
		if err == nil {
			_, err = st.Lookup(ctx, db.Pool, "s", "unfinished")
		}
		took := time.Since(start)
		tr.mu.Lock()
		if err != nil {
			tr.errs = append(tr.errs, fmt.Errorf("%s/%s: %w", scope, key, err))
		} else {
			tr.keys = append(tr.keys, scope+"/"+key)
			tr.done = append(tr.done, liveRequest{start, took})
		}
		tr.mu.Unlock()
		select {
		case tr.tick <- struct{}{}:
		default:
		}
	}
}

// window is a maintenance step's span and what it reported.
type window struct {
	what       string
	start, end time.Time
	stall      time.Duration // PartitionReport.Stall (Citus only)
}

// TestPartitionsUnderTraffic creates partitions ahead and removes partitions past
// retention, one removal at a time, while requests claim and look up keys: every
// request succeeds, every committed key is there exactly once, the partitions past
// retention are gone (rows and tables) except the one holding an unfinished key, and
// that key is still found. On Citus it checks that the table and its partitions are
// distributed and colocated and that a key's look-up runs on one shard, and that a
// claim outside READ COMMITTED is refused there too.
func TestPartitionsUnderTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := keytable.New()
	citus := pgtest.CitusMode()
	if citus {
		colocationWitness(t, db)
	}
	require.NoError(t, st.SetupPartitioned(ctx, db.Pool, keytable.PartitionMinute, 3*time.Minute))

	const removals = 4
	base := dbNow(t, db).UTC().Truncate(time.Minute).Add(-30 * time.Minute)
	past := pastMinutes(t, db, base, removals)
	if citus {
		requireDistributed(t, db)
	}
	tr, halt := startTraffic(ctx, db)
	defer halt()

	// Each step runs after the traffic has made 20 requests on its own.
	var windows []window
	for i := range removals {
		tr.await(20)
		start := time.Now()
		r, err := st.EnsurePartitions(ctx, db.Pool, time.Duration(4+i)*time.Minute)
		require.NoError(t, err)
		require.Positive(t, r.Created, "one more partition ahead (two if a minute began since the last step)")
		windows = append(windows, window{what: "create", start: start, end: time.Now()})
		tr.await(20)

		now := dbNow(t, db)
		start = time.Now()
		r, err = st.RemovePartitions(ctx, db.Pool, now.Sub(base.Add(time.Duration(i+1)*time.Minute)))
		require.NoError(t, err)
		require.Equal(t, 1, r.Removed, "removal %d", i)
		if citus {
			require.Positive(t, r.Stall, "the plain detach's stall is reported")
		} else {
			require.Zero(t, r.Stall, "a concurrent detach stalls nothing")
		}
		windows = append(windows, window{what: "remove " + past[i], start: start, end: time.Now(), stall: r.Stall})
	}
	// The last one past retention holds an unfinished key: kept.
	r, err := st.RemovePartitions(ctx, db.Pool, dbNow(t, db).Sub(base.Add((removals+1)*time.Minute)))
	require.NoError(t, err)
	require.Equal(t, 0, r.Removed)
	require.Equal(t, 1, r.Kept)
	halt()

	requireRemovedUnderTraffic(t, db, tr, base, past, removals)
	if citus {
		requireDistributed(t, db)
		requireRepeatableReadRefused(t, db)
	}
	logStalls(t, citus, tr.done, windows)
}

// pastMinutes attaches the minute partitions from base on, one more than removals,
// each holding 200 finished keys, and an unfinished key in the last: their names.
func pastMinutes(t *testing.T, db *pgtest.DB, base time.Time, removals int) []string {
	t.Helper()
	var past []string
	for i := range removals + 1 {
		past = append(past, attachMinute(t, db, base.Add(time.Duration(i)*time.Minute)))
		fillFinished(t, db, base.Add(time.Duration(i)*time.Minute), 200)
	}
	insertRaw(t, db, "unfinished", "00000000-0000-4000-8000-000000000001", "f",
		`'`+base.Add(time.Duration(removals)*time.Minute+time.Second).Format(time.RFC3339)+`'`, releasedSet)
	return past
}

// startTraffic starts four workers of traffic on db; halt stops them and waits for
// them (once; later calls do nothing).
func startTraffic(ctx context.Context, db *pgtest.DB) (tr *traffic, halt func()) {
	tr = &traffic{tick: make(chan struct{}, 64)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.run(ctx, db, w, stop)
		}()
	}
	stopped := false
	return tr, func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
}

// requireRemovedUnderTraffic checks, after TestPartitionsUnderTraffic's steps, that
// every live request succeeded and its key is there once, that the first removals
// partitions of past are gone (rows and tables) and the last kept, and that its
// unfinished key is still found.
func requireRemovedUnderTraffic(t *testing.T, db *pgtest.DB, tr *traffic, base time.Time, past []string, removals int) {
	t.Helper()
	ctx := context.Background()
	st := keytable.New()
	require.Empty(t, tr.errs, "every live request succeeded")
	require.NotEmpty(t, tr.keys)
	var rows, distinct, pastRows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (scope, idempotency_key))
FROM idemflow_keys WHERE idempotency_key LIKE 'live-%'`).Scan(&rows, &distinct))
	require.Equal(t, len(tr.keys), rows, "every committed key is there, once")
	require.Equal(t, rows, distinct, "no key twice")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE created_at < $1`,
		base.Add(time.Duration(removals)*time.Minute)).Scan(&pastRows))
	require.Zero(t, pastRows, "the removed partitions' rows are gone")
	names := partitionNames(t, db)
	for i, p := range past {
		if i < removals {
			require.NotContains(t, names, p)
		} else {
			require.Contains(t, names, p, "kept: it holds an unfinished key")
		}
	}
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = ANY($1)`, past[:removals]).Scan(&tables))
	require.Zero(t, tables, "dropped, not only detached")
	_, err := st.Lookup(ctx, db.Pool, "s", "unfinished")
	require.NoError(t, err)
}

// attachMinute is addPartition in two statements, which a Citus coordinator needs (a
// statement that creates a table and attaches it to a distributed one distributes it).
func attachMinute(t *testing.T, db *pgtest.DB, from time.Time) string {
	t.Helper()
	ctx := context.Background()
	name := "idemflow_keys_p" + from.UTC().Format("200601021504")
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idemflow_keys ATTACH PARTITION `+name+` FOR VALUES FROM ('`+
		from.UTC().Format(time.RFC3339)+`') TO ('`+from.Add(time.Minute).UTC().Format(time.RFC3339)+`')`)
	require.NoError(t, err)
	return name
}

// fillFinished inserts n finished keys created in the minute from, over eight scopes.
func fillFinished(t *testing.T, db *pgtest.DB, from time.Time, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at)
SELECT 's' || (i % 8), 'old-' || $1::text || '-' || i, gen_random_uuid(), 'f', 'POST', '/r', sha256('req'), '{}',
	$2::timestamptz + i * interval '100 milliseconds'
FROM generate_series(1, $3::int) i`, from.Format("1504"), from.Add(time.Second), n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE idemflow_keys SET `+finishedSet+`, finished_at = created_at
WHERE created_at >= $1 AND created_at < $2`, from, from.Add(time.Minute))
	require.NoError(t, err)
}

// requireDistributed checks, on Citus, that the key table and each of its partitions
// are distributed by scope in one colocation group, the plain key table's (that of
// colocationWitness), and that a key's look-up is routed to one shard.
func requireDistributed(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	var tables, groups, byScope int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT p.colocationid),
	count(*) FILTER (WHERE column_to_column_name(p.logicalrelid, p.partkey) = 'scope')
FROM pg_dist_partition p
WHERE p.logicalrelid = 'idemflow_keys'::regclass
	OR p.logicalrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idemflow_keys'::regclass)`).Scan(&tables, &groups, &byScope))
	require.Equal(t, len(partitionNames(t, db))+1, tables, "the table and every partition distributed")
	require.Equal(t, 1, groups, "colocated")
	require.Equal(t, tables, byScope, "by scope")
	var withWitness bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT p.colocationid = w.colocationid FROM pg_dist_partition p, pg_dist_partition w
WHERE p.logicalrelid = 'idemflow_keys'::regclass AND w.logicalrelid = 'colocation_witness'::regclass`).Scan(&withWitness))
	require.True(t, withWitness, "in the plain key table's colocation group (colocationWitness)")
	rows, err := db.Pool.Query(ctx, `EXPLAIN SELECT * FROM idemflow_keys WHERE scope = 's1' AND idempotency_key = 'k'`)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(plan, func(l string) bool { return strings.TrimSpace(l) == "Task Count: 1" }),
		"one shard:\n%s", strings.Join(plan, "\n"))
}

// colocationWitness distributes a table of its own in the plain key table's colocation
// group (one of its own: pgtest distributes the key table so), so that the group
// outlives the plain key table when the set-up drops it and requireDistributed can
// tell it from a new one.
func colocationWitness(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE colocation_witness (scope text NOT NULL)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT create_distributed_table('colocation_witness', 'scope', colocate_with => 'idemflow_keys')`)
	require.NoError(t, err)
}

// requireRepeatableReadRefused: on Citus too, a key row inserted outside READ
// COMMITTED is refused by the partitioned table's trigger, which runs on the shard.
func requireRepeatableReadRefused(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	b := &pgx.Batch{}
	st := keytable.New()
	c := claim("s", "rr", "00000000-0000-4000-8000-000000000002")
	q := st.QueueKeyWrite(b, keytable.KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte(`{}`)})
	br := tx.SendBatch(ctx, b)
	_, err = q.Read(br)
	_ = br.Close() // the error is err's
	require.ErrorIs(t, err, keytable.ErrRefused)
	require.ErrorContains(t, err, "READ COMMITTED only")
}

// logStalls logs, for each maintenance step, how long it took, the stall it reported,
// and the slowest live request that overlapped it, and the live requests' median and
// slowest outside every step.
func logStalls(t *testing.T, citus bool, done []liveRequest, windows []window) {
	server := "plain PostgreSQL"
	if citus {
		server = "Citus"
	}
	var outside []time.Duration
	for _, r := range done {
		in := false
		for _, w := range windows {
			in = in || r.start.Before(w.end) && r.start.Add(r.took).After(w.start)
		}
		if !in {
			outside = append(outside, r.took)
		}
	}
	slices.Sort(outside)
	if len(outside) > 0 {
		t.Logf("%s: %d live requests, %d outside maintenance: p50 %s, p99 %s, max %s", server, len(done), len(outside),
			outside[len(outside)/2], outside[len(outside)*99/100], outside[len(outside)-1])
	}
	for _, w := range windows {
		var slowest time.Duration
		n := 0
		for _, r := range done {
			if r.start.Before(w.end) && r.start.Add(r.took).After(w.start) {
				slowest = max(slowest, r.took)
				n++
			}
		}
		t.Logf("%s: %s took %s, reported stall %s; %d live requests overlapped it, slowest %s",
			server, w.what, w.end.Sub(w.start).Round(time.Millisecond), w.stall.Round(time.Millisecond), n, slowest.Round(time.Millisecond))
	}
}

// On Citus a key table alone in a colocation group of its own (distributed with
// colocate_with 'none', as the tests' are) keeps a group of its own through the
// partitioned set-up: the new table and its partitions share their group with no other
// table, with the old shard count. Joining the default group (the lowest-numbered one
// of its kind: here the decoy's, made first) would let the DDL of every other table
// there lock the key table, and hold up the removal's plain detach.
func TestPartitionedKeepsItsOwnGroup(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	ctx := context.Background()
	decoy := pgtest.NewEmpty(t)
	_, err := decoy.Pool.Exec(ctx, `CREATE TABLE decoy (scope text NOT NULL)`)
	require.NoError(t, err)
	var shards int
	require.NoError(t, decoy.Pool.QueryRow(ctx, `SELECT current_setting('citus.shard_count')::int`).Scan(&shards))
	_, err = decoy.Pool.Exec(ctx, `SELECT create_distributed_table('decoy', 'scope', colocate_with => 'none', shard_count => $1)`, shards)
	require.NoError(t, err)

	db := pgtest.New(t) // its key table in a group of its own, made after the decoy's
	var oldShards int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idemflow_keys'::regclass`).Scan(&oldShards))
	require.NoError(t, keytable.New().SetupPartitioned(ctx, db.Pool, keytable.PartitionMinute, 3*time.Minute))

	var others []string
	var newShards int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(o.logicalrelid::text) FILTER (WHERE o.logicalrelid <> p.logicalrelid
			AND o.logicalrelid NOT IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = p.logicalrelid)), '{}'),
		(SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = p.logicalrelid)
FROM pg_dist_partition p JOIN pg_dist_partition o ON o.colocationid = p.colocationid
WHERE p.logicalrelid = 'idemflow_keys'::regclass
GROUP BY p.logicalrelid`).Scan(&others, &newShards))
	require.Empty(t, others, "the partitioned key table's group holds it and its partitions only")
	require.Equal(t, oldShards, newShards, "the old shard count")
	require.NotEmpty(t, partitionNames(t, db))
	var apart int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i
WHERE i.inhparent = 'idemflow_keys'::regclass AND NOT EXISTS (SELECT 1 FROM pg_dist_partition o, pg_dist_partition p
	WHERE o.logicalrelid = i.inhrelid AND p.logicalrelid = i.inhparent AND o.colocationid = p.colocationid)`).Scan(&apart))
	require.Zero(t, apart, "every partition distributed in the table's group as it was attached")
}
