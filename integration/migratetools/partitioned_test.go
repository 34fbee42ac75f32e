package migratetools

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// shape describes a schema's key table as the catalog has it, with the schema's name
// left out: the parent's kind, partition key, columns, constraints, indexes and
// triggers, the functions of the schema, and for each partition its name, bounds,
// constraints (with whether each is the parent's) and indexes. Two schemas with the
// same shape hold the same table.
type shape struct {
	Parent     []string
	Functions  []string
	Partitions []partition
}

type partition struct {
	Name, Bound string
	Shape       []string
}

// describe reads the shape of the key table in pool's schema.
func describe(t *testing.T, pool *pgxpool.Pool, schema string) shape {
	t.Helper()
	ctx := context.Background()
	list := func(sql string, args ...any) []string {
		t.Helper()
		rows, err := pool.Query(ctx, sql, args...)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for i := range out {
			out[i] = strings.ReplaceAll(out[i], schema+".", "")
		}
		return out
	}
	// The shape of one relation: its columns (in order), constraints, indexes and
	// triggers. A partition's constraints and indexes say whether they are the
	// parent's (inherited) or its own. Citus names the truncate trigger it adds to a
	// distributed table by the table's oid, which differs between any two databases.
	of := func(rel string) []string {
		return list(`
			SELECT 'kind ' || relkind::text || coalesce(' ' || pg_get_partkeydef(oid), '') FROM pg_class WHERE oid = $1::regclass
			UNION ALL (
			SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END
				|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
			FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum)
			UNION ALL (
			SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
				|| ' local=' || conislocal::text || ' inherited=' || coninhcount::text || ' valid=' || convalidated::text
			FROM pg_constraint WHERE conrelid = $1::regclass ORDER BY conname)
			UNION ALL (
			SELECT 'index ' || pg_get_indexdef(indexrelid) || ' attached=' || (inhparent IS NOT NULL)::text
			FROM pg_index LEFT JOIN pg_inherits ON inhrelid = indexrelid
			WHERE indrelid = $1::regclass ORDER BY 1)
			UNION ALL (
			SELECT 'trigger ' || regexp_replace(pg_get_triggerdef(oid), '^CREATE TRIGGER truncate_trigger_[0-9]+ ', 'CREATE TRIGGER truncate_trigger_<oid> ')
			FROM pg_trigger
			WHERE tgrelid = $1::regclass ORDER BY tgname)`, rel)
	}
	s := shape{
		Parent:    of("idemflow_keys"),
		Functions: list(`SELECT pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace ORDER BY proname`),
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idemflow_keys'::regclass ORDER BY 1`)
	require.NoError(t, err)
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
		var p partition
		return p, r.Scan(&p.Name, &p.Bound)
	})
	require.NoError(t, err)
	for i := range parts {
		parts[i].Shape = of(parts[i].Name)
	}
	s.Partitions = parts
	return s
}

// dbNow is the database clock.
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// requireSameTable checks that got has the shape of want: the same parent, functions
// and partitions, each partition the same. Each side created its partitions from the
// database clock as it ran, from the current one to the one a week ahead: when a
// partition boundary passed between the two (from before want was made, t0, to after
// got was, t1), the sets are one partition apart at either end, so then only the
// partitions both have are compared, and each side's must still run without a gap.
func requireSameTable(t *testing.T, want, got shape, w time.Duration, t0, t1 time.Time) {
	t.Helper()
	require.Equal(t, want.Parent, got.Parent, "the partitioned table")
	require.Equal(t, want.Functions, got.Functions, "the schema's functions")
	require.NotEmpty(t, want.Partitions)
	require.NotEmpty(t, got.Partitions)
	if t0.Truncate(w).Equal(t1.Truncate(w)) && t0.Add(7*24*time.Hour).Truncate(w).Equal(t1.Add(7*24*time.Hour).Truncate(w)) {
		require.Equal(t, want.Partitions, got.Partitions, "the partitions, created from the clock in the same partition")
		return
	}
	t.Logf("a partition boundary passed between %s and %s: comparing the partitions both have", t0, t1)
	byName := map[string]partition{}
	for _, p := range want.Partitions {
		byName[p.Name] = p
	}
	common := 0
	for _, p := range got.Partitions {
		if q, ok := byName[p.Name]; ok {
			require.Equal(t, q, p)
			common++
		}
	}
	require.GreaterOrEqual(t, common, len(want.Partitions)-1)
}

// TestPartitionedExportByEachTool: `idemflow migrations export -partition` writes each
// tool's files for the partitioned key table (the same as migrations.PartitionedToolFS);
// the tool's library migrates a schema from them, and the table it makes is the one
// the engine's own path makes (migrations.Migrate, then store's SetupPartitioned): the
// same columns, keys, checks, indexes and trigger, the same partitions with the same
// bounds, each the same. Migrate then adopts the tool's record, the sweeper's
// maintenance finds nothing missing ahead, and the tool's down files remove it all.
// On Citus (IDEMFLOW_TEST_CITUS=1) both are distributed first (Distribute after the
// tool, as PartitionedToolFS says; before SetupPartitioned on the engine's path), and
// the parent and every partition of both are distributed by scope in the key tables'
// colocation group.
func TestPartitionedExportByEachTool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	for _, width := range []struct {
		flag string
		w    time.Duration
	}{{"day", migrations.PartitionDay}, {"week", migrations.PartitionWeek}} {
		t.Run(width.flag, func(t *testing.T) {
			t.Parallel()
			ref := pgtest.New(t) // Migrate (and Distribute, on Citus), then SetupPartitioned
			t0 := dbNow(t, ref.Pool)
			refStore, err := store.NewInSchema(ref.Schema)
			require.NoError(t, err)
			require.NoError(t, refStore.SetupPartitioned(ctx, ref.Pool, width.w, 0))
			want := describe(t, ref.Pool, ref.Schema)
			require.Equal(t, "kind p RANGE (created_at)", want.Parent[0])

			for _, tl := range tools() {
				t.Run(string(tl.name), func(t *testing.T) {
					t.Parallel()
					dir := filepath.Join(t.TempDir(), "migrations")
					out := runCLI(t, "migrations", "export", "-format", string(tl.name), "-partition", width.flag, dir)
					require.Contains(t, out, "(the key table partitioned by "+width.flag+")")
					fsys, err := migrations.PartitionedToolFS(tl.name, width.w)
					require.NoError(t, err)
					requireSameFiles(t, fsys, os.DirFS(dir))

					db := pgtest.NewEmpty(t)
					up, _, down := tl.open(t, db, os.DirFS(dir))
					require.NoError(t, up(), "%s migrates from the exported files", tl.name)
					m, err := migrations.NewMigrator(&migrations.Config{Schema: db.Schema})
					require.NoError(t, err)
					if pgtest.CitusMode() {
						require.NoError(t, m.Distribute(ctx, db.Pool, nil), "Distribute after the tool")
					}
					t1 := dbNow(t, db.Pool)
					got := describe(t, db.Pool, db.Schema)
					requireSameTable(t, want, got, width.w, t0, t1)
					if pgtest.CitusMode() {
						requireDistributedAlike(t, ref, db)
					}

					rep, err := m.Up(ctx, db.Pool)
					require.NoError(t, err, "Migrate adopts what the tool migrated")
					require.NotNil(t, rep.Adopted)
					require.Equal(t, len(all), rep.Adopted.Version)
					require.Empty(t, rep.Applied)

					st, err := store.NewInSchema(db.Schema)
					require.NoError(t, err)
					require.NoError(t, st.SetupPartitioned(ctx, db.Pool, width.w, 0), "set-up finds the layout and does nothing")
					ens, err := st.EnsurePartitions(ctx, db.Pool, 0)
					require.NoError(t, err)
					require.False(t, ens.Busy)
					require.False(t, ens.Low(), "the tool's partitions reach a week ahead: %+v", ens)
					if t0.Add(7 * 24 * time.Hour).Truncate(width.w).Equal(dbNow(t, db.Pool).Add(7 * 24 * time.Hour).Truncate(width.w)) {
						require.Zero(t, ens.Created, "nothing was missing ahead")
					}
					requireSameTable(t, want, describe(t, db.Pool, db.Schema), width.w, t0, dbNow(t, db.Pool))

					if !pgtest.CitusMode() { // a distributed table's down is not the tools' subject here
						require.NoError(t, down())
						require.Empty(t, objects(t, db.Pool), "the down files remove it all, the trigger's function included")
					}
				})
			}
		})
	}
}

// requireSameFiles checks that two file systems hold the same files, byte for byte.
func requireSameFiles(t *testing.T, want, got fs.FS) {
	t.Helper()
	read := func(fsys fs.FS) map[string]string {
		out := map[string]string{}
		require.NoError(t, fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, path)
			out[path] = string(b)
			return err
		}))
		return out
	}
	require.Equal(t, read(want), read(got))
}

// requireDistributedAlike checks, on Citus, that the key table of got and each of its
// partitions are distributed by scope in the colocation group of want's key table.
func requireDistributedAlike(t *testing.T, want, got *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	var group int
	require.NoError(t, want.Pool.QueryRow(ctx, `SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idemflow_keys'::regclass`).Scan(&group))
	rows, err := got.Pool.Query(ctx, `SELECT c.relname, coalesce(column_to_column_name(p.logicalrelid, p.partkey), '-'), coalesce(p.colocationid, -1)
		FROM pg_class c LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND c.relname LIKE 'idemflow\_keys%'
		ORDER BY 1`)
	require.NoError(t, err)
	type dist struct {
		Table, Column string
		Group         int
	}
	tables, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dist])
	require.NoError(t, err)
	require.Greater(t, len(tables), 1)
	for _, d := range tables {
		require.Equal(t, dist{d.Table, "scope", group}, d, "distributed by scope, colocated with the engine's")
	}
	require.True(t, slices.ContainsFunc(tables, func(d dist) bool { return d.Table == "idemflow_keys" }))
}
