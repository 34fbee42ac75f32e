package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

func TestAll(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	for i, m := range all {
		require.Equal(t, i+1, m.Version, "versions run 1, 2, 3… without gaps")
		require.NotEmpty(t, m.Name)
		require.NotEmpty(t, strings.TrimSpace(m.Up), "version %d up", m.Version)
		require.NotEmpty(t, strings.TrimSpace(m.Down), "version %d down", m.Version)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		got, err := migrations.Load(fstest.MapFS{
			"002_second.up.sql":   file("up 2"),
			"002_second.down.sql": file("down 2"),
			"001_first.up.sql":    file("up 1"),
			"001_first.down.sql":  file("down 1"),
		})
		require.NoError(t, err)
		require.Equal(t, []migrations.Migration{
			{Version: 1, Name: "first", Up: "up 1", Down: "down 1"},
			{Version: 2, Name: "second", Up: "up 2", Down: "down 2"},
		}, got)
	})

	for _, tc := range []struct {
		name string
		fsys fstest.MapFS
	}{
		{"Gap", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"003_c.up.sql": file("x"), "003_c.down.sql": file("x"),
		}},
		{"StartsAtZero", fstest.MapFS{
			"000_a.up.sql": file("x"), "000_a.down.sql": file("x"),
		}},
		{"DuplicateVersion", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"001_b.up.sql": file("x"), "001_b.down.sql": file("x"),
		}},
		{"DuplicateFile", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"1_a.up.sql": file("y"),
		}},
		{"MissingDown", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"002_b.up.sql": file("x"),
		}},
		{"MissingUp", fstest.MapFS{
			"001_a.down.sql": file("x"),
		}},
		{"EmptyUp", fstest.MapFS{
			"001_a.up.sql": file(""), "001_a.down.sql": file("x"),
		}},
		{"BadName", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"002_B.up.sql": file("x"), "002_B.down.sql": file("x"),
		}},
		{"NoDirection", fstest.MapFS{
			"001_a.sql": file("x"),
		}},
		{"StrayFile", fstest.MapFS{
			"001_a.up.sql": file("x"), "001_a.down.sql": file("x"),
			"README.md": file("x"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := migrations.Load(tc.fsys)
			require.ErrorIs(t, err, migrations.ErrInvalidSet)
		})
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	latest := len(all)

	t.Run("Fresh", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgtest.NewEmpty(t)
		v, err := migrations.Version(ctx, db.Pool)
		require.NoError(t, err)
		require.Zero(t, v, "no version table yet")

		require.NoError(t, migrations.Migrate(ctx, db.Pool))
		require.True(t, tableExists(t, db.Pool, "idemflow_keys"))
		v, err = migrations.Version(ctx, db.Pool)
		require.NoError(t, err)
		require.Equal(t, latest, v)
		rows := versionRows(t, db.Pool)
		require.Len(t, rows, latest)
		require.Equal(t, fmt.Sprintf("1 %s", all[0].Name), rows[0])
	})

	t.Run("Twice", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgtest.New(t)
		before := snapshot(t, db.Pool)
		require.NoError(t, migrations.Migrate(ctx, db.Pool))
		require.Equal(t, before, snapshot(t, db.Pool), "a second Migrate changes nothing")
	})

	t.Run("Concurrent", func(t *testing.T) { testMigrateConcurrent(t, all, latest) })

	t.Run("DownAndUp", func(t *testing.T) { testMigrateDownAndUp(t, latest) })

	t.Run("UnknownTarget", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		require.Error(t, migrations.MigrateTo(t.Context(), db.Pool, -1))
		require.Error(t, migrations.MigrateTo(t.Context(), db.Pool, latest+1))
	})

	t.Run("NewerDatabase", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgtest.New(t)
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+migrations.VersionTable+` (version, name) VALUES (99, 'from_a_newer_build')`)
		require.NoError(t, err)
		before := snapshot(t, db.Pool)

		require.NoError(t, migrations.Migrate(ctx, db.Pool), "an older build starts against a newer schema")
		require.Equal(t, before, snapshot(t, db.Pool))
		v, err := migrations.Version(ctx, db.Pool)
		require.NoError(t, err)
		require.Equal(t, 99, v)

		require.Error(t, migrations.MigrateTo(ctx, db.Pool, 0), "cannot revert what this build does not know")
		require.Equal(t, before, snapshot(t, db.Pool), "a failed MigrateTo changes nothing")
	})
}

func testMigrateDownAndUp(t *testing.T, latest int) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.New(t)
	up := objects(t, db.Pool)

	require.NoError(t, migrations.MigrateTo(ctx, db.Pool, 0))
	v, err := migrations.Version(ctx, db.Pool)
	require.NoError(t, err)
	require.Zero(t, v)
	require.Equal(t, []string{
		"index " + migrations.VersionTable + "_pkey",
		"table " + migrations.VersionTable,
	}, objects(t, db.Pool), "the down files remove everything the up files created")

	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	require.Equal(t, up, objects(t, db.Pool), "migrating up again recreates the same objects")
	v, err = migrations.Version(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, latest, v)
}

func testMigrateConcurrent(t *testing.T, all []migrations.Migration, latest int) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	const n = 8
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		pools[i] = db.NewPool(t) // one pool each: separate processes, in effect
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, pool := range pools {
		wg.Go(func() {
			<-start
			errs[i] = migrations.Migrate(t.Context(), pool)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "caller %d", i)
	}
	rows := versionRows(t, db.Pool)
	require.Len(t, rows, latest, "one row per version: %v", rows)
	for i, m := range all {
		require.Equal(t, fmt.Sprintf("%d %s", m.Version, m.Name), rows[i])
	}
}

// TestConstraints checks what the database itself rejects and what it leaves to the
// engine. Since 004 its one CHECK is the status (one of three); lengths and formats
// (since 002) and the rules tying a finished row to its whole response (since 004) are
// the engine's, for the cost of CHECKs on every write: a key the engine refuses is
// stored if some other code writes it, and workflow.ValidateKey refuses every such key;
// a row that breaks the state rules is stored too, and pgtest.SQLKeyStatesBroken, which
// every test schema runs over its rows at the end, names it.
func TestConstraints(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)

	type row struct {
		key            string
		status         string
		responseStatus int // 0: unfinished row; otherwise a finished row with this status
	}
	type execer interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
	insert := func(ctx context.Context, db execer, scope string, r row) error {
		status, recoveryPoint := "in_progress", "started"
		var respStatus, respHeaders, respBody, finishedAt any
		if r.responseStatus != 0 {
			status, recoveryPoint = "finished", "finished"
			respStatus, respHeaders, respBody, finishedAt = r.responseStatus, []byte(`{}`), []byte(`{"ok":true}`), time.Now()
		}
		if r.status != "" {
			status = r.status
		}
		_, err := db.Exec(ctx, `INSERT INTO idemflow_keys
			(scope, idempotency_key, id, flow, method, route, fingerprint, request_body,
			 status, recovery_point, response_status, response_headers, response_body, finished_at)
			VALUES ($1, $2, gen_random_uuid(), 'create_charge', 'POST', '/charges', sha256('{}'::bytea), '{}'::bytea,
			 $3, $4, $5, $6, $7, $8)`,
			scope, r.key, status, recoveryPoint, respStatus, respHeaders, respBody, finishedAt)
		return err
	}

	for _, tc := range []struct {
		name       string
		row        row
		constraint string // "" when the row is valid; "engine" when only the engine refuses it; "states" when it breaks the state rules
	}{
		{"ValidUnfinished", row{key: "order-1"}, ""},
		{"ValidFinished", row{key: "order-1", responseStatus: 201}, ""},
		{"ValidKey255", row{key: strings.Repeat("k", 255)}, ""},
		{"ValidPrintable", row{key: " !~azAZ09-_:/"}, ""},
		{"ValidFinished4xx", row{key: "order-1", responseStatus: 499}, ""},
		{"KeyTooLong", row{key: strings.Repeat("k", 256)}, "engine"},
		{"KeyEmpty", row{key: ""}, "engine"},
		{"KeyControlChar", row{key: "order\x01"}, "engine"},
		{"KeyNewline", row{key: "order\n1"}, "engine"},
		{"KeyDelete", row{key: "order\x7f"}, "engine"},
		{"KeyNonASCII", row{key: "ordér"}, "engine"},
		{"StatusBogus", row{key: "order-1", status: "bogus"}, "idemflow_keys_status"},
		{"ResponseStatus5xx", row{key: "order-1", responseStatus: 503}, "states"},
		{"FinishedWithoutResponse", row{key: "order-1", status: "finished"}, "states"},
		{"UnfinishedWithResponse", row{key: "order-1", status: "in_progress", responseStatus: 201}, "states"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.constraint == "states" {
				// In a transaction rolled back at the end: the row is stored, the
				// check names it, and no other case's check sees it.
				tx, err := db.Pool.Begin(t.Context())
				require.NoError(t, err)
				defer tx.Rollback(context.Background()) //nolint:errcheck // nothing to keep
				require.NoError(t, insert(t.Context(), tx, tc.name, tc.row), "since 004 the table leaves the state rules to the engine")
				rows, err := tx.Query(t.Context(), pgtest.SQLKeyStatesBroken)
				require.NoError(t, err)
				broken, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				require.Len(t, broken, 1)
				require.True(t, strings.HasPrefix(broken[0], tc.name+" order-1 "), "the check names the row: %v", broken)
				return
			}
			err := insert(t.Context(), db.Pool, tc.name, tc.row) // scope = case name: no key collisions
			switch tc.constraint {
			case "":
				require.NoError(t, err)
				require.NoError(t, workflow.ValidateKey(tc.row.key))
				return
			case "engine":
				require.NoError(t, err, "since 002 the table leaves key formats to the engine")
				require.ErrorIs(t, workflow.ValidateKey(tc.row.key), workflow.ErrInvalidKey)
				return
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "want a check violation, got %v", err)
			require.Equal(t, "23514", pgErr.Code, "check_violation: %v", pgErr)
			if pgtest.CitusMode() && pgErr.ConstraintName == "" {
				// Citus relays the worker's error by its text (ReportResultError), without
				// the constraint field; the text names the constraint (and the shard).
				require.Contains(t, pgErr.Message, fmt.Sprintf("violates check constraint %q", tc.constraint))
				return
			}
			require.Equal(t, tc.constraint, pgErr.ConstraintName)
		})
	}
}

// TestLeanChecks checks that the table keeps exactly the status check (004), that going
// back to 003 puts the two state checks back (002 kept three) and going back to 001
// the length and format checks.
func TestLeanChecks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.New(t)
	checks := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT conname FROM pg_constraint
			WHERE conrelid = 'idemflow_keys'::regclass AND contype = 'c' ORDER BY conname`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	require.Equal(t, []string{"idemflow_keys_status"}, checks())

	require.NoError(t, migrations.MigrateTo(ctx, db.Pool, 3))
	require.Equal(t, []string{"idemflow_keys_finished", "idemflow_keys_response_status", "idemflow_keys_status"}, checks())
	require.NoError(t, migrations.MigrateTo(ctx, db.Pool, 1))
	require.Len(t, checks(), 16, "001's checks are back")
	require.NoError(t, migrations.Migrate(ctx, db.Pool))
	require.Equal(t, []string{"idemflow_keys_status"}, checks())
}

func tableExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists))
	return exists
}

// versionRows returns "version name" for each row of the version table, in order.
func versionRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT version, name FROM `+migrations.VersionTable+` ORDER BY version`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int
		var name string
		require.NoError(t, rows.Scan(&v, &name))
		out = append(out, fmt.Sprintf("%d %s", v, name))
	}
	require.NoError(t, rows.Err())
	return out
}

// objects lists the tables, indexes, sequences, views and functions in the current schema.
func objects(t *testing.T, pool *pgxpool.Pool) []string { return objectsIn(t, pool, "") }

// objectsIn is objects in schema ("" for the current one).
func objectsIn(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		WITH s AS (SELECT coalesce(quote_ident(nullif($1, '')), current_schema())::regnamespace AS ns)
		SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence'
		                      WHEN 'v' THEN 'view' ELSE 'relation ' || c.relkind::text END || ' ' || c.relname
		FROM pg_class c
		WHERE c.relnamespace = (SELECT ns FROM s)
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure::text
		FROM pg_proc p
		WHERE p.pronamespace = (SELECT ns FROM s)
		UNION ALL
		SELECT 'type ' || ty.typname
		FROM pg_type ty
		WHERE ty.typnamespace = (SELECT ns FROM s) AND ty.typtype IN ('e', 'd', 'c')
		  AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = ty.typrelid AND c.relkind <> 'c')
		ORDER BY 1`, schema)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// snapshot captures the version table (with applied_at) and the schema's objects.
func snapshot(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT version, name, applied_at FROM `+migrations.VersionTable+` ORDER BY version`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int
		var name string
		var at time.Time
		require.NoError(t, rows.Scan(&v, &name, &at))
		out = append(out, fmt.Sprintf("version %d %s %s", v, name, at.UTC().Format(time.RFC3339Nano)))
	}
	require.NoError(t, rows.Err())
	return append(out, objects(t, pool)...)
}
