package migratetools

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

var (
	cliOnce sync.Once
	cliBin  string
	cliErr  error
)

// cli builds the idemflow command from this repository, once.
func cli(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemflow-migratetools-")
		if err != nil {
			cliErr = err
			return
		}
		cliBin = filepath.Join(dir, "idemflow")
		cmd := exec.Command("go", "build", "-o", cliBin, "./cmd/idemflow")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("build idemflow: %w\n%s", err, out)
		}
	})
	require.NoError(t, cliErr)
	return cliBin
}

// runCLI runs the idemflow command and returns its standard output; it must succeed.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(cli(t), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "idemflow %v: %s", args, stderr.String())
	return string(out)
}

// idemflowMigrate runs `idemflow migrate VERB` on db's schema.
func idemflowMigrate(t *testing.T, db *pgtest.DB, verb string) string {
	t.Helper()
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return runCLI(t, "-database-url", u.String(), "-schema", db.Schema, "migrate", verb)
}

// TestExportedFilesByTheCLI: `idemflow migrations export` writes each tool's files to a
// directory; the tool migrates a schema from that directory; `idemflow migrate status`
// then says which tool applied what, and `migrate up` says it adopted the tool's
// record, and runs nothing.
func TestExportedFilesByTheCLI(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	ref := pgtest.New(t)
	want := objects(t, ref.Pool)
	for _, tl := range tools() {
		t.Run(string(tl.name), func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "migrations")
			out := runCLI(t, "migrations", "export", "-format", string(tl.name), dir)
			files, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Contains(t, out, fmt.Sprintf("wrote %d %s files to %s", len(files), tl.name, dir))

			db := pgtest.NewEmpty(t)
			up, _, _ := tl.open(t, db, os.DirFS(dir))
			require.NoError(t, up(), "%s migrates from the exported files", tl.name)
			require.Equal(t, want, objects(t, db.Pool), "the tool makes from the files what Migrate makes")

			status := idemflowMigrate(t, db, "status")
			require.Contains(t, status, fmt.Sprintf("schema at version 0 of %d (%d pending)", len(all), len(all)))
			require.Contains(t, status, fmt.Sprintf("%s's %s records version %d\n", tl.name, tl.table, len(all)))
			require.Contains(t, status, "`migrate up` adopts its record")

			adopted := idemflowMigrate(t, db, "up")
			require.Contains(t, adopted, fmt.Sprintf("adopted the schema from %s's %s at version %d: recorded versions 1..%d in %s without running them",
				tl.name, tl.table, len(all), len(all), migrations.VersionTable))
			require.NotContains(t, adopted, "applied ", "adopting runs nothing")
			require.Contains(t, adopted, fmt.Sprintf("schema at version %d of %d (up to date)", len(all), len(all)))
			require.Equal(t, want, objects(t, db.Pool))

			again := idemflowMigrate(t, db, "up")
			require.NotContains(t, again, "adopted", "adopted once")
		})
	}
}

// TestUpReportsAdoption: Migrator.Up returns the adoption and the migrations it applied
// when a tool had applied only the first.
func TestUpReportsAdoption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	db := pgtest.NewEmpty(t)
	_, to, _ := openGoose(t, db, toolFS(t, migrations.Goose))
	require.NoError(t, to(1))
	m, err := migrations.NewMigrator(nil)
	require.NoError(t, err)
	st, err := m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, st.Adoptable())
	require.Equal(t, []migrations.ToolRecord{{Tool: migrations.Goose, Table: "goose_db_version", Version: 1}}, st.Tools)

	rep, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, &migrations.Adoption{Tool: migrations.Goose, Table: "goose_db_version", Version: 1}, rep.Adopted)
	require.Equal(t, 1, rep.From)
	require.Equal(t, len(all), rep.To)
	require.Equal(t, all[1:], rep.Applied)
	require.Contains(t, rep.String(), "adopted the schema from goose's goose_db_version at version 1")
	require.Contains(t, rep.String(), "applied 002_"+all[1].Name)

	st, err = m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, len(all), st.Version)
	require.False(t, st.Adoptable())
}

// gooseTags leave out of goose's command every database driver but PostgreSQL's.
const gooseTags = "no_clickhouse no_libsql no_mssql no_mysql no_sqlite3 no_vertica no_ydb"

// pinned is the version of module mod this module requires.
func pinned(t *testing.T, mod string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod).Output()
	require.NoError(t, err, "go list -m %s", mod)
	return strings.TrimSpace(string(out))
}

// command is a migration tool's own command-line program, at the version of the library
// this module pins, that migrates the schema of connection URL dbURL up from dir.
func command(t *testing.T, tool migrations.Tool, dbURL, dir string) *exec.Cmd {
	t.Helper()
	switch tool {
	case migrations.Tern:
		// The go.mod's tool directive.
		return exec.Command("go", "tool", "tern", "migrate", "--conn-string", dbURL, "--migrations", dir, "--version-table", "schema_version")
	case migrations.Goose:
		return exec.Command("go", "run", "-tags", gooseTags,
			"github.com/pressly/goose/v3/cmd/goose@"+pinned(t, "github.com/pressly/goose/v3"), "-dir", dir, "postgres", dbURL, "up")
	case migrations.GolangMigrate:
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		u.Scheme = "pgx5"
		return exec.Command("go", "run", "-tags", "pgx5",
			"github.com/golang-migrate/migrate/v4/cmd/migrate@"+pinned(t, "github.com/golang-migrate/migrate/v4"), "-path", dir, "-database", u.String(), "up")
	}
	t.Fatalf("no command for %s", tool)
	return nil
}

// TestExportedFilesByTheToolsCommands: each tool's own command-line program (tern's as
// the go.mod's tool; goose's and golang-migrate's by go run at the pinned version, with
// only their PostgreSQL drivers) migrates a schema from the files
// `idemflow migrations export` wrote, and idemflow's CLI names and adopts its record.
// The connection string's search_path puts each tool's version table in the schema.
func TestExportedFilesByTheToolsCommands(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	want := objects(t, pgtest.New(t).Pool)
	for _, tl := range tools() {
		t.Run(string(tl.name), func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "migrations")
			runCLI(t, "migrations", "export", "-format", string(tl.name), dir)
			db := pgtest.NewEmpty(t)
			out, err := command(t, tl.name, db.URL, dir).CombinedOutput()
			require.NoError(t, err, "%s: %s", tl.name, out)
			require.Equal(t, want, objects(t, db.Pool), "%s's command makes from the files what Migrate makes", tl.name)

			status := idemflowMigrate(t, db, "status")
			require.Contains(t, status, fmt.Sprintf("%s's %s records version %d\n", tl.name, tl.table, len(all)))
			require.Contains(t, idemflowMigrate(t, db, "up"),
				fmt.Sprintf("adopted the schema from %s's %s at version %d", tl.name, tl.table, len(all)))
		})
	}
}
