package reliability

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The soak's key table layouts (IDEMFLOW_SOAK_LAYOUT): "plain", the default table
// whose finished keys the workers' sweepers delete in batches, or "partitioned", the
// partitioned key table (docs/PARTITIONS.md) in partitions of soakPartitionWidth, which
// the same sweepers create ahead and remove past retention on every pass, as in
// production. Unset, the full soak runs the plain layout and the quick tier both.
const (
	envSoakLayout     = "IDEMFLOW_SOAK_LAYOUT"
	layoutPlain       = "plain"
	layoutPartitioned = "partitioned"
)

// soakPartitionWidth is the partitioned soak's partition width: a minute, so that with
// the soak's retention (5m; 1m in the quick tier) partitions are created ahead (ten,
// the default for widths under an hour) and one is removed every minute once the
// first is past retention. A key stays up to one width longer than with batched
// deletes (rowBound).
const soakPartitionWidth = store.PartitionMinute

// soakLayouts are the layouts this run soaks, from IDEMFLOW_SOAK_LAYOUT.
func soakLayouts(t testing.TB) []string {
	t.Helper()
	switch raw := os.Getenv(envSoakLayout); raw {
	case layoutPlain, layoutPartitioned:
		return []string{raw}
	case "":
		if soakMode() {
			return []string{layoutPlain}
		}
		return []string{layoutPlain, layoutPartitioned}
	default:
		t.Fatalf("%s=%q: want %q or %q", envSoakLayout, raw, layoutPlain, layoutPartitioned)
		return nil
	}
}

// newSoakEnv is the soak's env on a fresh schema: its key table turned into the
// layout's (before the audit trigger and the charges processes, which learn the layout
// once), and the capture of every key row retention removes (rel_retired): rows the
// sweepers delete, by a row trigger, and, on the partitioned layout, the rows of every
// partition as it is dropped (retiredPartitionSQL). It returns the first partition
// (nil on the plain layout).
func newSoakEnv(t testing.TB, cfg soakConfig) (*env, *store.Partition) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	var first *store.Partition
	if cfg.layout == layoutPartitioned {
		if pgtest.CitusMode() {
			t.Skip("skipped on Citus: the capture of a dropped partition's rows for the checker (an event trigger on the coordinator) is not built for distributed partitions")
		}
		st, err := store.NewInSchema(db.Schema)
		require.NoError(t, err)
		require.NoError(t, st.SetupPartitioned(ctx, db.Pool, cfg.width, 0))
		parts, err := st.Partitions(ctx, db.Pool)
		require.NoError(t, err)
		require.NotEmpty(t, parts)
		first = &parts[0]
	}
	env := newEnv(t, db)
	_, err := env.db.Pool.Exec(ctx, retiredSQL(env.db.Schema))
	require.NoError(t, err)
	if cfg.layout == layoutPartitioned {
		_, err = env.db.Pool.Exec(ctx, retiredPartitionSQL(env.db.Schema))
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = env.db.Pool.Exec(ctx, "DROP EVENT TRIGGER IF EXISTS "+retireEventTrigger(env.db.Schema))
		})
	}
	return env, first
}

// plainSchema is what retiredPartitionSQL accepts as a schema name: pgtest's, which
// needs no escaping in an identifier or a pattern.
var plainSchema = regexp.MustCompile(`^[a-z0-9_]{1,50}$`)

func retireEventTrigger(schema string) string {
	return pgx.Identifier{"rel_retire_" + schema}.Sanitize()
}

// retiredPartitionSQL creates, in schema, rel_dropped and the event trigger that, as a
// DROP TABLE of one of the schema's key table partitions starts (attached or detached:
// the sweeper detaches first), copies the partition's rows into rel_retired (how =
// 'drop') and records the partition in rel_dropped with the rows it held. A partition
// removal deletes no row, so the row trigger of retiredSQL sees none of them. It runs
// in the dropping transaction: a drop that fails copies nothing. Event triggers are
// per database, so it acts only on a statement that names a partition of this schema
// (the sweeper's drop names it qualified), and it is dropped with the schema.
func retiredPartitionSQL(schema string) string {
	if !plainSchema.MatchString(schema) {
		panic(fmt.Sprintf("retiredPartitionSQL: schema %q is not a plain name", schema))
	}
	s := pgx.Identifier{schema}.Sanitize()
	return fmt.Sprintf(`
CREATE TABLE %[1]s.rel_dropped (
	name       text        NOT NULL,
	rows       bigint      NOT NULL,
	dropped_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION %[1]s.rel_retire_partition() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
	m text[];
	n bigint;
BEGIN
	FOR m IN SELECT regexp_matches(current_query(), '"%[2]s"\."(idemflow_keys_p[0-9]+)"', 'g') LOOP
		CONTINUE WHEN to_regclass(format('%%I.%%I', '%[2]s', m[1])) IS NULL;
		EXECUTE format('INSERT INTO %[1]s.rel_retired (scope, idem_key, id, flow, status, response_status, response_body, how)
			SELECT scope, idempotency_key, id, flow, status, response_status, response_body, ''drop'' FROM %%I.%%I', '%[2]s', m[1]);
		GET DIAGNOSTICS n = ROW_COUNT;
		INSERT INTO %[1]s.rel_dropped (name, rows) VALUES (m[1], n);
	END LOOP;
END
$$;
CREATE EVENT TRIGGER %[3]s ON ddl_command_start WHEN TAG IN ('DROP TABLE')
	EXECUTE FUNCTION %[1]s.rel_retire_partition();`, s, schema, retireEventTrigger(schema))
}

// retiredCounts are the rows rel_retired holds by how they were removed: deleted (by
// the sweepers' batched deletes) and dropped (with their partition), and how many
// partitions were dropped (rel_dropped; 0 on the plain layout).
func retiredCounts(ctx context.Context, t testing.TB, e *env, layout string) (deleted, dropped, partitions int64) {
	t.Helper()
	err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE how = 'delete'), count(*) FILTER (WHERE how = 'drop')
		FROM rel_retired`).Scan(&deleted, &dropped)
	require.NoError(t, err)
	if layout == layoutPartitioned {
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM rel_dropped`).Scan(&partitions))
	}
	return deleted, dropped, partitions
}

// requirePartitionsCaptured checks, at the end of a partitioned soak, that every
// partition gone since the first (first) was captured as it was dropped: each
// partition from first to the oldest one left is in rel_dropped. A partition removed
// in a way the event trigger did not see (its rows not checked) fails it. It returns
// how many were removed.
func requirePartitionsCaptured(ctx context.Context, t testing.TB, e *env, first *store.Partition, width time.Duration) int {
	t.Helper()
	st, err := store.NewInSchema(e.db.Schema)
	require.NoError(t, err)
	parts, err := st.Partitions(ctx, e.db.Pool)
	require.NoError(t, err)
	require.NotEmpty(t, parts)
	require.NotNil(t, first.From)
	require.NotNil(t, parts[0].From)
	var captured []string
	rows, err := e.db.Pool.Query(ctx, `SELECT name FROM rel_dropped`)
	require.NoError(t, err)
	captured, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	n := 0
	for at := *first.From; at.Before(*parts[0].From); at = at.Add(width) {
		name := "idemflow_keys_p" + at.UTC().Format("200601021504")
		require.True(t, slices.Contains(captured, name), "partition %s is gone and its drop was not captured (captured: %v)", name, captured)
		n++
	}
	return n
}

// TestSoakPartitionCapture: the partitioned soak's checker sees the rows of every
// partition dropped (retiredPartitionSQL), and so catches what a removal must never
// do. The library's removal of a partition past retention is captured, with its rows;
// partitions dropped by hand as the removal does (detach, then drop) are checked like
// deleted rows: clean when every key was finished, a key that was unfinished reported,
// and every key reported missing when the drop is not captured.
func TestSoakPartitionCapture(t *testing.T) {
	t.Parallel()
	cfg := soakConfig{layout: layoutPartitioned, width: soakPartitionWidth}
	ctx := context.Background()
	t.Run("library removal", func(t *testing.T) {
		t.Parallel()
		env, _ := newSoakEnv(t, cfg)
		en := env.engine(env.pool(poolOpts{}), nil)
		_, err := env.do(ctx, en, request("acct", "a", "", 100))
		require.NoError(t, err)
		name := pastPartitionWith(ctx, t, env, "a", "old")
		st, err := store.NewInSchema(env.db.Schema)
		require.NoError(t, err)
		r, err := st.RemovePartitions(ctx, env.db.Pool, 5*time.Minute)
		require.NoError(t, err)
		require.Equal(t, 1, r.Removed, "the past partition is removed")
		var rows int64
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT rows FROM rel_dropped WHERE name = $1`, name).Scan(&rows))
		require.Equal(t, int64(1), rows)
		var how, status string
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT how, status FROM rel_retired WHERE idem_key = 'old'`).Scan(&how, &status))
		require.Equal(t, []string{"drop", "finished"}, []string{how, status})
	})
	for _, c := range []struct {
		name       string
		stuck      bool // a key left unfinished (the provider failed it) is dropped too
		uncaptured bool // the event trigger is gone before the drop
	}{{name: "finished"}, {name: "unfinished", stuck: true}, {name: "uncaptured", uncaptured: true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env, _ := newSoakEnv(t, cfg)
			en := env.engine(env.pool(poolOpts{}), nil)
			keys := [][2]string{{"acct", "a"}, {"acct", "b"}}
			for _, k := range keys {
				_, err := env.do(ctx, en, request(k[0], k[1], "", 100))
				require.NoError(t, err)
			}
			if c.stuck {
				env.provider.FailNext(1)
				_, err := env.do(ctx, en, request("acct", "stuck", "", 101))
				require.Error(t, err)
				keys = append(keys, [2]string{"acct", "stuck"})
			}
			if c.uncaptured {
				_, err := env.db.Pool.Exec(ctx, "DROP EVENT TRIGGER "+retireEventTrigger(env.db.Schema))
				require.NoError(t, err)
			}
			dropKeyPartitions(ctx, t, env)
			var left int64
			require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys`).Scan(&left))
			require.Zero(t, left, "every key's partition was dropped")

			tb := &captureTB{TB: t}
			r := env.check(tb, checkOpts{keys: keys, retired: true})
			switch {
			case c.uncaptured:
				require.Equal(t, 2, r.Unfinished, "both keys reported missing: %v", r.Violations)
				require.Zero(t, r.Retired)
			case c.stuck:
				require.Equal(t, 3, r.Retired)
				require.Equal(t, 1, r.Unfinished, "the unfinished key dropped is reported: %v", r.Violations)
				require.Contains(t, fmt.Sprint(r.Violations), "stuck is unfinished")
			default:
				require.Empty(t, tb.errors)
				require.Empty(t, r.Violations)
				require.Equal(t, 2, r.Retired)
			}
		})
	}
}

// pastPartitionWith attaches a partition ten minutes in the past (named as the layout
// names it) holding a copy of key's finished row under the key as, created then.
func pastPartitionWith(ctx context.Context, t testing.TB, e *env, key, as string) string {
	t.Helper()
	var from time.Time
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT date_trunc('minute', now()) - interval '10 minutes'`).Scan(&from))
	name := "idemflow_keys_p" + from.UTC().Format("200601021504")
	s := pgx.Identifier{e.db.Schema}.Sanitize()
	p := pgx.Identifier{e.db.Schema, name}.Sanitize()
	_, err := e.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[2]s (LIKE %[1]s.idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE %[1]s.idemflow_keys ATTACH PARTITION %[2]s FOR VALUES FROM ('%[3]s') TO ('%[4]s')`,
		s, p, from.UTC().Format(time.RFC3339), from.Add(soakPartitionWidth).UTC().Format(time.RFC3339)))
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
SELECT (jsonb_populate_record(k, jsonb_build_object('idempotency_key', $2::text, 'id', gen_random_uuid(), 'created_at', $3::timestamptz))).*
FROM idemflow_keys k WHERE idempotency_key = $1 AND status = 'finished'`, key, as, from.Add(time.Second))
	require.NoError(t, err)
	return name
}

// dropKeyPartitions removes every partition holding a key row as the sweeper removes
// one, whatever its keys' state: detached concurrently, then dropped.
func dropKeyPartitions(ctx context.Context, t testing.TB, e *env) {
	t.Helper()
	rows, err := e.db.Pool.Query(ctx, `SELECT DISTINCT c.relname::text FROM idemflow_keys k JOIN pg_class c ON c.oid = k.tableoid`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, names)
	for _, n := range names {
		p := pgx.Identifier{e.db.Schema, n}.Sanitize()
		_, err := e.db.Pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s.idemflow_keys DETACH PARTITION %s CONCURRENTLY`, pgx.Identifier{e.db.Schema}.Sanitize(), p))
		require.NoError(t, err)
		_, err = e.db.Pool.Exec(ctx, `DROP TABLE `+p)
		require.NoError(t, err)
	}
}
