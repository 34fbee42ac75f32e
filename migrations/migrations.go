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
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// simple sends the migrator's statements with the simple protocol, whatever the pool's
// query exec mode: a migration runs once, and so it works behind a pooler that keeps no
// prepared statements (pgbouncer in transaction mode) even in pgx's default mode.
// Statements without arguments go that way anyway.
const simple = pgx.QueryExecModeSimpleProtocol

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

// Config configures a Migrator. The zero value (or a nil *Config) is the current schema.
type Config struct {
	// Schema is the PostgreSQL schema that holds idemflow's objects: the key table, its
	// function and the version table. Migrate creates it if it does not exist and runs
	// the files with the transaction's search_path set to it (SET LOCAL, so nothing
	// outlives the transaction, behind a pooler too). Defaults to "": the current
	// schema (the first entry of the connection's search_path). At most 63 bytes.
	Schema string
}

// Migrator applies the migrations in one schema. It is safe for concurrent use.
type Migrator struct {
	schema  string // "" for the current schema
	table   string // the version table, qualified when schema is set
	lockKey string // an SQL expression naming the schema for the migration lock
}

// NewMigrator returns a Migrator for cfg's schema; cfg may be nil. It fails on a schema
// name PostgreSQL cannot hold (longer than 63 bytes, a NUL byte).
func NewMigrator(cfg *Config) (*Migrator, error) {
	var schema string
	if cfg != nil {
		schema = cfg.Schema
	}
	switch {
	case len(schema) > 63:
		return nil, fmt.Errorf("migrations: schema name %q is longer than 63 bytes", schema)
	case strings.IndexByte(schema, 0) >= 0:
		return nil, fmt.Errorf("migrations: schema name %q contains a NUL byte", schema)
	}
	if schema == "" {
		return &Migrator{table: VersionTable, lockKey: "current_schema()"}, nil
	}
	return &Migrator{
		schema:  schema,
		table:   pgx.Identifier{schema, VersionTable}.Sanitize(),
		lockKey: quoteLiteral(schema),
	}, nil
}

// currentSchema is the migrator of the current schema, behind the package's functions.
var currentSchema = &Migrator{table: VersionTable, lockKey: "current_schema()"}

// Migrate applies every pending migration, in order, in one transaction. Concurrent
// callers on the same schema wait for each other on a transaction-scoped advisory lock;
// the later ones find nothing to do. A database already at a newer version than this
// build knows is left alone, so an older binary can still start during a rolling deploy.
// A schema that a migration tool migrated from the files of ToolFS is adopted (see
// Migrator.Migrate). It works in the current schema; for another, use a Migrator.
func Migrate(ctx context.Context, db Beginner) error { return currentSchema.Migrate(ctx, db) }

// MigrateTo is Migrator.MigrateTo in the current schema.
func MigrateTo(ctx context.Context, db Beginner, version int) error {
	return currentSchema.MigrateTo(ctx, db, version)
}

// Version is Migrator.Version in the current schema.
func Version(ctx context.Context, db Beginner) (int, error) { return currentSchema.Version(ctx, db) }

// Migrate applies every pending migration, in order, in one transaction, as the
// package's Migrate does, in m's schema.
//
// A schema whose key table exists but whose version table records nothing was made by
// something else. If one migration tool's version table is there (golang-migrate's
// schema_migrations, goose's goose_db_version or tern's schema_version, in the same
// schema) and says which of these migrations it applied, clean, Migrate adopts the
// schema: it records those versions as applied (a baseline) and applies the rest.
// Otherwise it refuses with an error wrapping ErrUnknownState that says what to do, and
// changes nothing.
func (m *Migrator) Migrate(ctx context.Context, db Beginner) error {
	_, err := m.Up(ctx, db)
	return err
}

// Up is Migrate, and reports what it did: the adoption of a tool's record, if any, and
// the migrations it applied.
func (m *Migrator) Up(ctx context.Context, db Beginner) (*Report, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	return m.apply(ctx, db, all, len(all))
}

// MigrateTo moves m's schema to the given version, applying up or down files as
// needed. Version 0 removes everything idemflow created except the version table (and
// the schema).
func (m *Migrator) MigrateTo(ctx context.Context, db Beginner, version int) error {
	all, err := All()
	if err != nil {
		return err
	}
	if version < 0 || version > len(all) {
		return fmt.Errorf("migrations: unknown version %d (known: 0..%d)", version, len(all))
	}
	_, err = m.apply(ctx, db, all, version)
	return err
}

// Version reports the highest version recorded in m's schema, or 0 when none is.
func (m *Migrator) Version(ctx context.Context, db Beginner) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	exists, err := m.exists(ctx, tx, VersionTable)
	if err != nil {
		return 0, fmt.Errorf("migrations: find version table: %w", err)
	}
	if !exists {
		return 0, nil
	}
	return m.current(ctx, tx)
}

// exists reports whether m's schema holds a table (or view) named name.
func (m *Migrator) exists(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
	ident := name
	if m.schema != "" {
		ident = pgx.Identifier{m.schema, name}.Sanitize()
	}
	var ok bool
	err := tx.QueryRow(ctx, `SELECT to_regclass(`+quoteLiteral(ident)+`) IS NOT NULL`, simple).Scan(&ok)
	return ok, err
}

// begin starts the transaction a migration runs in, takes the schema's lock, makes sure
// the version table exists and reads the version it records. The caller rolls tx back
// unless it commits; on an error tx is rolled back already.
func (m *Migrator) begin(ctx context.Context, db Beginner) (_ pgx.Tx, cur int, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(ctx)
		}
	}()
	if err := m.lock(ctx, tx); err != nil {
		return nil, 0, err
	}
	if err := m.ensureTable(ctx, tx); err != nil {
		return nil, 0, err
	}
	cur, err = m.current(ctx, tx)
	if err != nil {
		return nil, 0, err
	}
	return tx, cur, nil
}

func (m *Migrator) apply(ctx context.Context, db Beginner, all []Migration, target int) (*Report, error) {
	tx, cur, err := m.begin(ctx, db)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	rep := &Report{}
	if cur == 0 {
		if rep.Adopted, err = m.adopt(ctx, tx, all); err != nil {
			return nil, err
		}
		if rep.Adopted != nil {
			cur = rep.Adopted.Version
		}
	}
	rep.From, rep.To = cur, cur
	if cur > len(all) && target == len(all) {
		return rep, nil // a newer build migrated this schema; nothing of ours to do
	}
	if err := onCitusSequential(ctx, tx); err != nil {
		return nil, err
	}
	for v := cur + 1; v <= target; v++ {
		mig := all[v-1]
		if err := run(ctx, tx, mig.Up); err != nil {
			return nil, fmt.Errorf("migrations: apply %03d_%s: %w", mig.Version, mig.Name, err)
		}
		if err := m.record(ctx, tx, mig); err != nil {
			return nil, err
		}
		rep.Applied, rep.To = append(rep.Applied, mig), v
	}
	for v := cur; v > target; v-- {
		if v > len(all) {
			return nil, fmt.Errorf("migrations: database is at version %d, newer than this build (%d)", cur, len(all))
		}
		mig := all[v-1]
		if err := run(ctx, tx, mig.Down); err != nil {
			return nil, fmt.Errorf("migrations: revert %03d_%s: %w", mig.Version, mig.Name, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+m.table+` WHERE version = $1`, simple, mig.Version); err != nil {
			return nil, fmt.Errorf("migrations: unrecord %03d: %w", mig.Version, err)
		}
		rep.To = v - 1
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrations: commit: %w", err)
	}
	return rep, nil
}

// lock takes the schema's migration lock for tx and, for a named schema, creates it if
// need be and makes it tx's search_path, for the files' unqualified names. One lock per
// schema: processes migrating different schemas don't wait for each other.
func (m *Migrator) lock(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idemflow.migrate:' || `+m.lockKey+`, 0))`); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	if m.schema != "" {
		quoted := pgx.Identifier{m.schema}.Sanitize()
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+quoted+`; SET LOCAL search_path TO `+quoted); err != nil {
			return fmt.Errorf("migrations: schema %s: %w", quoted, err)
		}
	}
	return nil
}

// onCitusSequential makes tx run its commands on Citus's distributed tables over one
// connection per worker (citus.multi_shard_modify_mode = sequential, SET LOCAL) when
// the database has the citus extension; it does nothing without it. In the default,
// parallel mode, a DDL statement on a distributed table opens several connections per
// worker, after which Citus refuses, in the same transaction, a command that must use
// one (DROP FUNCTION: "there was a parallel operation on a distributed table in the
// transaction"). Sequential mode keeps a whole migration, down files included, in one
// transaction; the tables are small or it is rare, so the lost parallelism is cheap.
func onCitusSequential(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT set_config('citus.multi_shard_modify_mode', 'sequential', true)
		FROM pg_catalog.pg_extension WHERE extname = 'citus'`, simple)
	if err != nil {
		return fmt.Errorf("migrations: sequential mode on Citus: %w", err)
	}
	return nil
}

// run sends a migration file's statements one at a time, in order.
func run(ctx context.Context, tx pgx.Tx, file string) error {
	for i, stmt := range statements(file) {
		if _, err := tx.Exec(ctx, stmt, simple); err != nil {
			return fmt.Errorf("statement %d: %w", i+1, err)
		}
	}
	return nil
}

func (m *Migrator) record(ctx context.Context, tx pgx.Tx, mig Migration) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+m.table+` (version, name) VALUES ($1, $2)`, simple, mig.Version, mig.Name); err != nil {
		return fmt.Errorf("migrations: record %03d: %w", mig.Version, err)
	}
	return nil
}

func (m *Migrator) ensureTable(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.table+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`)
	if err != nil {
		return fmt.Errorf("migrations: create version table: %w", err)
	}
	return nil
}

func (m *Migrator) current(ctx context.Context, tx pgx.Tx) (int, error) {
	var v int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+m.table, simple).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	return v, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
