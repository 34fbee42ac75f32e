package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table in which Migrate records applied versions.
const VersionTable = "idemflow_schema_migrations"

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// ErrInvalidSet is returned when the embedded files have a gap, a duplicate or a missing
// half of an up/down pair.
var ErrInvalidSet = errors.New("migrations: invalid migration set")

// Beginner starts a transaction; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

var fileName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// All returns the embedded migrations in version order. It fails with ErrInvalidSet if
// versions do not run 1, 2, 3… without gaps or duplicates, or if a file lacks its pair.
func All() ([]Migration, error) { return load(files) }

func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("%w: unexpected file name %q", ErrInvalidSet, e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", e.Name(), err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if mig.Name != m[2] {
			return nil, fmt.Errorf("%w: version %d has two names, %q and %q", ErrInvalidSet, v, mig.Name, m[2])
		}
		half := &mig.Up
		if m[3] == "down" {
			half = &mig.Down
		}
		if *half != "" {
			return nil, fmt.Errorf("%w: duplicate %s file for version %d", ErrInvalidSet, m[3], v)
		}
		*half = string(body)
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("%w: version %d lacks its up or down file", ErrInvalidSet, m.Version)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("%w: expected version %d, found %d", ErrInvalidSet, i+1, m.Version)
		}
	}
	return out, nil
}

// Migrate applies every pending migration, in order, in one transaction. Concurrent
// callers on the same schema wait for each other on a transaction-scoped advisory lock;
// the later ones find nothing to do. A database already at a newer version than this
// build knows is left alone, so an older binary can still start during a rolling deploy.
func Migrate(ctx context.Context, db Beginner) error {
	all, err := All()
	if err != nil {
		return err
	}
	return apply(ctx, db, all, len(all))
}

// MigrateTo moves the schema to the given version, applying up or down files as needed.
// Version 0 removes everything idemflow created except the version table.
func MigrateTo(ctx context.Context, db Beginner, version int) error {
	all, err := All()
	if err != nil {
		return err
	}
	if version < 0 || version > len(all) {
		return fmt.Errorf("migrations: unknown version %d (known: 0..%d)", version, len(all))
	}
	return apply(ctx, db, all, version)
}

// Version reports the highest applied version, or 0 when none is.
func Version(ctx context.Context, db Beginner) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('`+VersionTable+`') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrations: find version table: %w", err)
	}
	if !exists {
		return 0, nil
	}
	return current(ctx, tx)
}

func apply(ctx context.Context, db Beginner, all []Migration, target int) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	// One lock per schema: processes migrating different schemas don't wait for each other.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idemflow.migrate:' || current_schema(), 0))`); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	if err := ensureTable(ctx, tx); err != nil {
		return err
	}
	cur, err := current(ctx, tx)
	if err != nil {
		return err
	}
	if cur > len(all) && target == len(all) {
		return nil // a newer build migrated this schema; nothing of ours to do
	}
	for v := cur + 1; v <= target; v++ {
		m := all[v-1]
		if _, err := tx.Exec(ctx, m.Up); err != nil {
			return fmt.Errorf("migrations: apply %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+VersionTable+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return fmt.Errorf("migrations: record %03d: %w", m.Version, err)
		}
	}
	for v := cur; v > target; v-- {
		if v > len(all) {
			return fmt.Errorf("migrations: database is at version %d, newer than this build (%d)", cur, len(all))
		}
		m := all[v-1]
		if _, err := tx.Exec(ctx, m.Down); err != nil {
			return fmt.Errorf("migrations: revert %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+VersionTable+` WHERE version = $1`, m.Version); err != nil {
			return fmt.Errorf("migrations: unrecord %03d: %w", m.Version, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}

func ensureTable(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+VersionTable+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`)
	if err != nil {
		return fmt.Errorf("migrations: create version table: %w", err)
	}
	return nil
}

func current(ctx context.Context, tx pgx.Tx) (int, error) {
	var v int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+VersionTable).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	return v, nil
}
