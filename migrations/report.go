package migrations

import (
	"context"
	"fmt"
	"strings"
)

// Adoption is what Migrate did to adopt a schema that a migration tool had migrated:
// it recorded versions 1 to Version, which the tool's table Table says it applied, in
// VersionTable, without running them. The tool's table is left as it was.
type Adoption struct {
	Tool    Tool
	Table   string
	Version int
}

func (a *Adoption) String() string {
	return fmt.Sprintf("adopted the schema from %s's %s at version %d: recorded versions 1..%d in %s without running them (%s is left as it was)",
		a.Tool, a.Table, a.Version, a.Version, VersionTable, a.Table)
}

// Report says what Migrator.Up did.
type Report struct {
	// From is the version recorded before (after an adoption, the adopted one); To the
	// version recorded after.
	From, To int
	// Adopted is set when the schema was adopted from a migration tool's record.
	Adopted *Adoption
	// Applied are the migrations run, in order.
	Applied []Migration
}

// String is the report as lines for a person: the adoption, each migration applied,
// and the version the schema is at.
func (r *Report) String() string {
	var b strings.Builder
	if r.Adopted != nil {
		b.WriteString(r.Adopted.String() + "\n")
	}
	for _, mig := range r.Applied {
		fmt.Fprintf(&b, "applied %03d_%s\n", mig.Version, mig.Name)
	}
	if len(r.Applied) == 0 {
		fmt.Fprintf(&b, "nothing to apply: at version %d\n", r.To)
	} else {
		fmt.Fprintf(&b, "now at version %d\n", r.To)
	}
	return b.String()
}

// ToolRecord is a migration tool's version table found beside the key table.
type ToolRecord struct {
	Tool    Tool   `json:"tool"`
	Table   string `json:"table"`
	Version int    `json:"version"`
	Dirty   bool   `json:"dirty"`
}

// Status is what Migrator.Status finds in a schema.
type Status struct {
	// Version is the highest version recorded in VersionTable (0 when none is), and
	// Latest the newest migration this build has.
	Version int `json:"version"`
	Latest  int `json:"latest"`
	// KeyTable says whether the key table exists.
	KeyTable bool `json:"key_table"`
	// Tools are the migration tools' version tables in the schema (golang-migrate's
	// schema_migrations, goose's goose_db_version, tern's schema_version), with what
	// each records. A tool's table may also record the application's own migrations.
	Tools []ToolRecord `json:"tools,omitempty"`
}

// Adoptable reports whether Migrate would adopt the schema from a tool's record: the
// key table exists, VersionTable records nothing, and a tool's table records a version.
func (s *Status) Adoptable() bool {
	return s.Version == 0 && s.KeyTable && len(s.Tools) > 0
}

// String is the status as lines for a person.
func (s *Status) String() string {
	var b strings.Builder
	state := "up to date"
	if s.Version < s.Latest {
		state = fmt.Sprintf("%d pending", s.Latest-s.Version)
	}
	fmt.Fprintf(&b, "schema at version %d of %d (%s), as recorded in %s\n", s.Version, s.Latest, state, VersionTable)
	for _, t := range s.Tools {
		dirty := ""
		if t.Dirty {
			dirty = ", dirty"
		}
		fmt.Fprintf(&b, "%s's %s records version %d%s\n", t.Tool, t.Table, t.Version, dirty)
	}
	switch {
	case s.Adoptable():
		b.WriteString("the key table was migrated by the tool above; `migrate up` adopts its record (or says why it cannot)\n")
	case s.Version == 0 && s.KeyTable:
		b.WriteString("the key table exists but nothing records its version: see migrations.Migrator.Baseline\n")
	}
	return b.String()
}

// Status reports the version m's schema records, whether it has the key table, and
// every migration tool's version table found there. It changes nothing.
func (m *Migrator) Status(ctx context.Context, db Beginner) (*Status, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	st := &Status{Latest: len(all)}
	ok, err := m.exists(ctx, tx, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: find version table: %w", err)
	}
	if ok {
		if st.Version, err = m.current(ctx, tx); err != nil {
			return nil, err
		}
	}
	if st.KeyTable, err = m.exists(ctx, tx, "idemflow_keys"); err != nil {
		return nil, fmt.Errorf("migrations: find key table: %w", err)
	}
	for _, tt := range toolTables {
		v, dirty, ok, err := m.readTool(ctx, tx, tt)
		if err != nil {
			return nil, err
		}
		if ok {
			st.Tools = append(st.Tools, ToolRecord{Tool: tt.tool, Table: tt.table, Version: v, Dirty: dirty})
		}
	}
	return st, nil
}
