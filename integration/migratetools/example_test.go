package migratetools

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	ternmigrate "github.com/jackc/tern/v2/migrate"
	"github.com/pressly/goose/v3"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
)

// The README's snippets, one per tool: apply idemflow's migrations with the tool a team
// already runs, then let the engine's process call migrations.Migrate, which adopts
// what the tool applied and has nothing left to do.

func ExampleToolFS_golangMigrate() {
	ctx := context.Background()
	dsn, done := emptySchema(ctx)
	defer done()

	fsys, _ := migrations.ToolFS(migrations.GolangMigrate)
	src, err := iofs.New(fsys, ".")
	check(err)
	db, err := sql.Open("pgx", dsn)
	check(err)
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{})
	check(err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	check(err)
	defer m.Close()
	check(m.Up())
	v, dirty, err := m.Version()
	fmt.Println(int(v) == newest(), dirty, err)
	fmt.Println(adopted(ctx, dsn))
	// Output:
	// true false <nil>
	// adopted at the newest version: true <nil>
}

func ExampleToolFS_goose() {
	ctx := context.Background()
	dsn, done := emptySchema(ctx)
	defer done()

	fsys, _ := migrations.ToolFS(migrations.Goose)
	db, err := sql.Open("pgx", dsn)
	check(err)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys)
	check(err)
	_, err = p.Up(ctx)
	check(err)
	v, err := p.GetDBVersion(ctx)
	fmt.Println(int(v) == newest(), err)
	fmt.Println(adopted(ctx, dsn))
	// Output:
	// true <nil>
	// adopted at the newest version: true <nil>
}

func ExampleToolFS_tern() {
	ctx := context.Background()
	dsn, done := emptySchema(ctx)
	defer done()

	fsys, _ := migrations.ToolFS(migrations.Tern)
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	defer conn.Close(ctx)
	m, err := ternmigrate.NewMigrator(ctx, conn, "schema_version")
	check(err)
	check(m.LoadMigrations(fsys))
	check(m.Migrate(ctx))
	v, err := m.GetCurrentVersion(ctx)
	fmt.Println(int(v) == newest(), err)
	fmt.Println(adopted(ctx, dsn))
	// Output:
	// true <nil>
	// adopted at the newest version: true <nil>
}

// adopted runs migrations.Migrate, as the engine's process does at start, and says
// whether the version it then records is the newest.
func adopted(ctx context.Context, dsn string) string {
	pool, err := pgxpool.New(ctx, dsn)
	check(err)
	defer pool.Close()
	check(migrations.Migrate(ctx, pool))
	v, err := migrations.Version(ctx, pool)
	return fmt.Sprintf("adopted at the newest version: %v %v", v == newest(), err)
}

// newest is the newest migration's version.
func newest() int {
	all, err := migrations.All()
	check(err)
	return all[len(all)-1].Version
}

// emptySchema makes an empty schema on the test server and returns a URL whose
// search_path is that schema, and a function that drops it.
func emptySchema(ctx context.Context) (string, func()) {
	pool, drop, err := idemflowtest.NewExampleDB(ctx) // a migrated schema, emptied here
	check(err)
	var schema string
	check(pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	_, err = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE; CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())
	check(err)
	u, err := url.Parse(pool.Config().ConnConfig.ConnString())
	check(err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop
}

func check(err error) {
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		panic(err)
	}
}
