package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrUnknownState is returned by Migrate when idemflow's key table exists but nothing
// says which migrations made it, or a tool's record of them cannot be trusted. Nothing
// was changed; the message says what to do.
var ErrUnknownState = errors.New("migrations: the schema's migration state is unknown")

// toolTable is a migration tool's version table as Migrate reads it to adopt a schema.
type toolTable struct {
	tool    Tool
	table   string
	columns []string // that the table must have to be the tool's
	query   string   // the applied version and whether it is dirty, from %s
	fix     string   // what to do when the table says the state is dirty
}

var toolTables = []toolTable{
	{GolangMigrate, "schema_migrations", []string{"version", "dirty"},
		`SELECT coalesce(max(version), 0), coalesce(bool_or(dirty), false) FROM %s`,
		"golang-migrate marks it dirty (a migration failed halfway): repair the schema, run `migrate force <version>`"},
	{Goose, "goose_db_version", []string{"version_id", "is_applied"},
		`SELECT coalesce(max(version_id) FILTER (WHERE is_applied), 0), false FROM %s`, ""},
	{Tern, "schema_version", []string{"version"},
		`SELECT coalesce(max(version), 0), false FROM %s`, ""},
}

// adopt runs when m's version table records nothing. It returns nil when the schema
// has no key table (nothing to adopt). When it has one, it finds the migration tool
// that made it and records the versions the tool applied, returning what it adopted.
// A tool's version above the newest migration is refused, like anything else it cannot
// trust, with ErrUnknownState.
func (m *Migrator) adopt(ctx context.Context, tx pgx.Tx, all []Migration) (*Adoption, error) {
	keys, err := m.exists(ctx, tx, "idemflow_keys")
	if err != nil {
		return nil, fmt.Errorf("migrations: find key table: %w", err)
	}
	if !keys {
		return nil, nil
	}
	v, tt, err := m.adoptable(ctx, tx, all)
	if err != nil {
		return nil, err
	}
	for _, mig := range all[:v] {
		if err := m.record(ctx, tx, mig); err != nil {
			return nil, err
		}
	}
	return &Adoption{Tool: tt.tool, Table: tt.table, Version: v}, nil
}

// adoptable finds, in a schema that has the key table and no version of its own, the
// one migration tool whose record Migrate may adopt, and the version it records.
func (m *Migrator) adoptable(ctx context.Context, tx pgx.Tx, all []Migration) (int, toolTable, error) {
	where := "the current schema"
	if m.schema != "" {
		where = "schema " + pgx.Identifier{m.schema}.Sanitize()
	}
	var found []string
	version, from, chosen := 0, Tool(""), toolTable{}
	for _, tt := range toolTables {
		v, dirty, ok, err := m.readTool(ctx, tx, tt)
		if err != nil {
			return 0, toolTable{}, err
		}
		if !ok {
			continue
		}
		found = append(found, fmt.Sprintf("%s's %s at version %d", tt.tool, tt.table, v))
		if dirty {
			return 0, toolTable{}, fmt.Errorf("%w: %s has idemflow_keys and %s's %s at version %d, which %s, then call Migrate again; nothing was changed",
				ErrUnknownState, where, tt.tool, tt.table, v, tt.fix)
		}
		if from != "" && v != version {
			return 0, toolTable{}, fmt.Errorf("%w: %s has idemflow_keys and two tools' version tables that disagree (%s); drop the one that is stale, then call Migrate again; nothing was changed",
				ErrUnknownState, where, strings.Join(found, ", "))
		}
		version, from, chosen = v, tt.tool, tt
	}
	if from == "" || version < 1 {
		detail := "no migration tool's version table (golang-migrate's schema_migrations, goose's goose_db_version, tern's schema_version)"
		if from != "" {
			detail = strings.Join(found, ", ")
		}
		return 0, toolTable{}, fmt.Errorf("%w: %s has idemflow_keys but %s records no version and it has %s. "+
			"If these migrations made it, call Baseline with the version it is at (%d if it is at the newest) "+
			"to record it; if it is not idemflow's table, move it out of the way. Then call Migrate again; nothing was changed",
			ErrUnknownState, where, m.table, detail, len(all))
	}
	if version > len(all) {
		// A tool's table can also hold the application's own migrations (a timestamp
		// version, say), so a version above what idemflow has ever shipped says nothing
		// about the key table: adopting it would skip idemflow's migrations for good.
		return 0, toolTable{}, fmt.Errorf("%w: %s has idemflow_keys and %s, above the newest idemflow migration (%d): "+
			"that table records other migrations too, or a newer idemflow made it. Call Baseline with the "+
			"version the key table is at, then call Migrate again; nothing was changed",
			ErrUnknownState, where, strings.Join(found, ", "), len(all))
	}
	return version, chosen, nil
}

// readTool reads tt's version table in m's schema: ok is false when there is no table
// of that name with the tool's columns.
func (m *Migrator) readTool(ctx context.Context, tx pgx.Tx, tt toolTable) (version int, dirty, ok bool, err error) {
	ident := tt.table
	if m.schema != "" {
		ident = pgx.Identifier{m.schema, tt.table}.Sanitize()
	}
	var cols int
	err = tx.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass(`+quoteLiteral(ident)+`) AND attname = ANY($1) AND NOT attisdropped`,
		simple, tt.columns).Scan(&cols)
	if err != nil {
		return 0, false, false, fmt.Errorf("migrations: look for %s's %s: %w", tt.tool, tt.table, err)
	}
	if cols != len(tt.columns) {
		return 0, false, false, nil
	}
	var v int64
	if err := tx.QueryRow(ctx, fmt.Sprintf(tt.query, ident), simple).Scan(&v, &dirty); err != nil {
		return 0, false, false, fmt.Errorf("migrations: read %s's %s: %w", tt.tool, tt.table, err)
	}
	return int(v), dirty, true, nil
}

// Baseline records migrations 1 to version as applied in m's schema without running
// them, for a schema that something other than Migrate (a tool Migrate does not know,
// by hand) brought to that version: Migrate then applies only what comes after. It
// fails, changing nothing, when the version table already records a version, when
// version is outside 1..len(All()), or when the schema has no key table.
func (m *Migrator) Baseline(ctx context.Context, db Beginner, version int) error {
	all, err := All()
	if err != nil {
		return err
	}
	if version < 1 || version > len(all) {
		return fmt.Errorf("migrations: baseline: unknown version %d (known: 1..%d)", version, len(all))
	}
	tx, cur, err := m.begin(ctx, db)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if cur != 0 {
		return fmt.Errorf("migrations: baseline: %s already records version %d", m.table, cur)
	}
	keys, err := m.exists(ctx, tx, "idemflow_keys")
	if err != nil {
		return fmt.Errorf("migrations: find key table: %w", err)
	}
	if !keys {
		return fmt.Errorf("migrations: baseline: there is no idemflow_keys table to record a version of; call Migrate instead")
	}
	for _, mig := range all[:version] {
		if err := m.record(ctx, tx, mig); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}
