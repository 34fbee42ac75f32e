package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestMigrateInSchema migrates a named schema through a pool whose search_path is
// another: everything lands in the named schema, nothing in the pool's.
func TestMigrateInSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewEmpty(t)
	schema := db.Schema + ` "idem"`
	t.Cleanup(func() {
		_, err := db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		require.NoError(t, err)
	})
	m, err := migrations.NewMigrator(&migrations.Config{Schema: schema})
	require.NoError(t, err)
	all, err := migrations.All()
	require.NoError(t, err)

	require.NoError(t, m.Migrate(ctx, db.Pool), "creates the schema")
	require.NoError(t, m.Migrate(ctx, db.Pool), "and is a no-op the second time")
	v, err := m.Version(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, len(all), v)
	up := objectsIn(t, db.Pool, schema)
	require.Contains(t, up, "table idemflow_keys")
	require.Contains(t, up, "table "+migrations.VersionTable)
	require.Empty(t, objects(t, db.Pool), "nothing in the pool's own schema")
	v, err = migrations.Version(ctx, db.Pool)
	require.NoError(t, err)
	require.Zero(t, v, "the current schema's version is its own")

	require.NoError(t, m.MigrateTo(ctx, db.Pool, 0))
	require.Equal(t, []string{"index " + migrations.VersionTable + "_pkey", "table " + migrations.VersionTable},
		objectsIn(t, db.Pool, schema))
	require.NoError(t, m.Migrate(ctx, db.Pool))
	require.Equal(t, up, objectsIn(t, db.Pool, schema))
}

// TestUnrecordedSchema: a key table that no version table accounts for is refused,
// changing nothing, until Baseline records its version.
func TestUnrecordedSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewEmpty(t)
	all, err := migrations.All()
	require.NoError(t, err)
	for _, m := range all { // applied by hand, as a tool idemflow does not know would
		_, err := db.Pool.Exec(ctx, m.Up)
		require.NoError(t, err)
	}
	before := objects(t, db.Pool)

	err = migrations.Migrate(ctx, db.Pool)
	require.ErrorIs(t, err, migrations.ErrUnknownState)
	require.ErrorContains(t, err, "call Baseline")
	require.ErrorContains(t, err, "nothing was changed")
	require.Equal(t, before, objects(t, db.Pool), "a refused Migrate creates not even its version table")

	m, err := migrations.NewMigrator(nil)
	require.NoError(t, err)
	require.Error(t, m.Baseline(ctx, db.Pool, 0))
	require.Error(t, m.Baseline(ctx, db.Pool, len(all)+1))
	require.Equal(t, before, objects(t, db.Pool))
	require.NoError(t, m.Baseline(ctx, db.Pool, len(all)))
	require.Error(t, m.Baseline(ctx, db.Pool, len(all)), "a recorded schema is not baselined again")
	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	v, err := migrations.Version(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, len(all), v)

	empty := pgtest.NewEmpty(t)
	require.ErrorContains(t, m.Baseline(ctx, empty.Pool, 1), "no idemflow_keys table")
}

// TestToolTableOfTheApplication: a tool's version table whose version is above every
// idemflow migration (the application's own migrations share it) is not adopted: Migrate
// refuses and changes nothing, instead of taking the key table for the newest and
// skipping idemflow's migrations for good.
func TestToolTableOfTheApplication(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewEmpty(t)
	all, err := migrations.All()
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, all[0].Up) // idemflow's first migration, applied by the tool
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CREATE TABLE schema_migrations (version bigint PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO schema_migrations VALUES (20261201093000, false)`) // and the application's own, later
	require.NoError(t, err)
	before := objects(t, db.Pool)

	err = migrations.Migrate(ctx, db.Pool)
	require.ErrorIs(t, err, migrations.ErrUnknownState)
	require.ErrorContains(t, err, "above the newest idemflow migration")
	require.ErrorContains(t, err, "Call Baseline")
	require.Equal(t, before, objects(t, db.Pool), "nothing was changed")
}

// TestToolFS: every migration ships in every tool's format, made from the same files.
func TestToolFS(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	for _, tool := range migrations.Tools() {
		fsys, err := migrations.ToolFS(tool)
		require.NoError(t, err, tool)
		names, err := fs.Glob(fsys, "*")
		require.NoError(t, err)
		perMigration := 1
		if tool == migrations.GolangMigrate {
			perMigration = 2
		}
		require.Len(t, names, perMigration*len(all), "%s: one file set per migration: %v", tool, names)
		for _, m := range all {
			base := fmt.Sprintf("%03d_%s", m.Version, m.Name)
			read := func(name string) string {
				b, err := fs.ReadFile(fsys, name)
				require.NoError(t, err, "%s lacks %s", tool, name)
				return string(b)
			}
			switch tool {
			case migrations.GolangMigrate:
				require.Equal(t, m.Up, read(base+".up.sql"))
				require.Equal(t, m.Down, read(base+".down.sql"))
			case migrations.Goose:
				f := read(base + ".sql")
				up, down, ok := strings.Cut(f, "-- +goose Down\n")
				require.True(t, ok)
				require.Contains(t, up, "-- +goose Up\n-- +goose StatementBegin\n"+m.Up)
				require.Contains(t, down, "-- +goose StatementBegin\n"+m.Down)
			case migrations.Tern:
				up, down, ok := strings.Cut(read(base+".sql"), "\n---- create above / drop below ----\n")
				require.True(t, ok)
				require.Equal(t, m.Up, up)
				require.Equal(t, m.Down, down)
			default:
				t.Fatalf("no check for tool %s", tool)
			}
		}
	}
	_, err = migrations.ToolFS("flyway")
	require.ErrorContains(t, err, "unknown tool")
}

// TestPartitioned: the partitioned set is All with the first migration's table
// partitioned by created_at (its primary key including it), the READ COMMITTED trigger
// and the first partitions' block added, and its function dropped by the down file;
// every other file is the same. Widths that are not a week and do not divide a day
// into whole minutes are refused. migrations/tooltest applies the sets with each tool
// and compares the table with the engine's.
func TestPartitioned(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	for _, w := range []time.Duration{migrations.PartitionWeek, migrations.PartitionDay, migrations.PartitionHour, 15 * time.Minute} {
		part, err := migrations.Partitioned(w)
		require.NoError(t, err, w)
		require.Len(t, part, len(all))
		require.Equal(t, all[1:], part[1:], "%s: only the first migration differs", w)
		first := part[0].Up
		require.Contains(t, first, "    PRIMARY KEY (scope, idempotency_key, created_at),\n")
		require.Contains(t, first, "\n) PARTITION BY RANGE (created_at);\n")
		require.Contains(t, first, "CREATE TRIGGER idemflow_keys_read_committed BEFORE INSERT ON idemflow_keys")
		require.Contains(t, first, fmt.Sprintf("width constant interval := '%d minutes';", w/time.Minute))
		require.Equal(t, all[0].Down+"DROP FUNCTION IF EXISTS idemflow_keys_read_committed();\n", part[0].Down)
		for _, tool := range migrations.Tools() {
			fsys, err := migrations.PartitionedToolFS(tool, w)
			require.NoError(t, err)
			plain, err := migrations.ToolFS(tool)
			require.NoError(t, err)
			names, err := fs.Glob(fsys, "*")
			require.NoError(t, err)
			plainNames, err := fs.Glob(plain, "*")
			require.NoError(t, err)
			require.Equal(t, plainNames, names, "%s: the same file names", tool)
		}
	}
	for _, w := range []time.Duration{0, time.Second, 7 * time.Minute, 2 * 24 * time.Hour, 30 * 24 * time.Hour} {
		_, err := migrations.Partitioned(w)
		require.ErrorContains(t, err, "is not a week and does not divide a day", w)
		_, err = migrations.PartitionedToolFS(migrations.Goose, w)
		require.Error(t, err, w)
	}
}
