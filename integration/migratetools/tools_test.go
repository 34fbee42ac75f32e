package migratetools

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for golang-migrate and goose
	ternmigrate "github.com/jackc/tern/v2/migrate"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// tool drives one migration tool's library on a schema: to the newest version, to a
// given one, and all the way down.
type tool struct {
	name migrations.Tool
	// open returns the tool on db's schema, released when the test ends.
	open func(t *testing.T, db *pgtest.DB, fsys fs.FS) (up func() error, to func(v int) error, down func() error)
	// table is the tool's version table.
	table string
}

func tools() []tool {
	return []tool{
		{migrations.GolangMigrate, openGolangMigrate, "schema_migrations"},
		{migrations.Goose, openGoose, "goose_db_version"},
		{migrations.Tern, openTern, "schema_version"},
	}
}

func toolFS(t *testing.T, name migrations.Tool) fs.FS {
	t.Helper()
	fsys, err := migrations.ToolFS(name)
	require.NoError(t, err)
	return fsys
}

func sqlDB(t *testing.T, db *pgtest.DB) *sql.DB {
	t.Helper()
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	return sdb
}

func openGolangMigrate(t *testing.T, db *pgtest.DB, fsys fs.FS) (func() error, func(int) error, func() error) {
	src, err := iofs.New(fsys, ".")
	require.NoError(t, err)
	drv, err := migratepgx.WithInstance(sqlDB(t, db), &migratepgx.Config{})
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	noChange := func(err error) error {
		if errors.Is(err, migrate.ErrNoChange) {
			return nil
		}
		return err
	}
	return func() error { return noChange(m.Up()) },
		func(v int) error { return noChange(m.Migrate(uint(v))) },
		func() error { return noChange(m.Down()) }
}

func openGoose(t *testing.T, db *pgtest.DB, fsys fs.FS) (func() error, func(int) error, func() error) {
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB(t, db), fsys)
	require.NoError(t, err)
	ctx := context.Background()
	return func() error { _, err := p.Up(ctx); return err },
		func(v int) error { _, err := p.UpTo(ctx, int64(v)); return err },
		func() error { _, err := p.DownTo(ctx, 0); return err }
}

func openTern(t *testing.T, db *pgtest.DB, fsys fs.FS) (func() error, func(int) error, func() error) {
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	m, err := ternmigrate.NewMigrator(ctx, conn.Conn(), "schema_version")
	require.NoError(t, err)
	require.NoError(t, m.LoadMigrations(fsys))
	return func() error { return m.Migrate(ctx) },
		func(v int) error { return m.MigrateTo(ctx, int32(v)) },
		func() error { return m.MigrateTo(ctx, 0) }
}

// objects lists the schema's relations and functions, less the tools' version tables.
func objects(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'relation ' || relname FROM pg_class
		WHERE relnamespace = current_schema()::regnamespace
			AND relname NOT IN ('schema_migrations', 'schema_migrations_pkey', 'goose_db_version',
				'goose_db_version_pkey', 'goose_db_version_id_seq', 'schema_version',
				'idemflow_schema_migrations', 'idemflow_schema_migrations_pkey')
		UNION ALL
		SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
		ORDER BY 1`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func TestTools(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	ref := pgtest.New(t) // what Migrate makes, to compare with
	want := objects(t, ref.Pool)
	require.Contains(t, want, "relation idemflow_keys")

	for _, tl := range tools() {
		t.Run(string(tl.name), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()

			t.Run("UpDownUpThenAdopted", func(t *testing.T) {
				t.Parallel()
				db := pgtest.NewEmpty(t)
				up, _, down := tl.open(t, db, toolFS(t, tl.name))
				require.NoError(t, up())
				require.Equal(t, want, objects(t, db.Pool), "the tool makes what Migrate makes")
				require.NoError(t, down())
				require.Empty(t, objects(t, db.Pool), "the down files remove it all")
				require.NoError(t, up())
				require.Equal(t, want, objects(t, db.Pool))

				require.NoError(t, migrations.Migrate(ctx, db.Pool), "Migrate adopts what the tool migrated")
				v, err := migrations.Version(ctx, db.Pool)
				require.NoError(t, err)
				require.Equal(t, len(all), v)
				require.Equal(t, want, objects(t, db.Pool), "adopting runs nothing")
				require.NoError(t, migrations.Migrate(ctx, db.Pool))
			})

			t.Run("AdoptedHalfway", func(t *testing.T) {
				t.Parallel()
				db := pgtest.NewEmpty(t)
				_, to, _ := tl.open(t, db, toolFS(t, tl.name))
				require.NoError(t, to(1))
				require.NoError(t, migrations.Migrate(ctx, db.Pool), "records 1, applies the rest")
				v, err := migrations.Version(ctx, db.Pool)
				require.NoError(t, err)
				require.Equal(t, len(all), v)
				require.Equal(t, want, objects(t, db.Pool))
			})
		})
	}

	t.Run("DirtyIsRefused", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := pgtest.NewEmpty(t)
		_, to, _ := openGolangMigrate(t, db, toolFS(t, migrations.GolangMigrate))
		require.NoError(t, to(1))
		_, err := db.Pool.Exec(ctx, `UPDATE schema_migrations SET dirty = true`) // as a failed migration leaves it
		require.NoError(t, err)
		before := objects(t, db.Pool)
		err = migrations.Migrate(ctx, db.Pool)
		require.ErrorIs(t, err, migrations.ErrUnknownState)
		require.ErrorContains(t, err, "migrate force")
		require.Equal(t, before, objects(t, db.Pool))
		var versionTable bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&versionTable))
		require.False(t, versionTable, "nothing was changed, not even a version table")
	})
}
