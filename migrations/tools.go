package migrations

import (
	"fmt"
	"io/fs"
	"testing/fstest"
)

// Tool names a migration tool whose file layout ToolFS writes.
type Tool string

// The tools ToolFS writes files for.
const (
	// GolangMigrate is github.com/golang-migrate/migrate (v4): NNN_name.up.sql and
	// NNN_name.down.sql, the embedded files as they are.
	GolangMigrate Tool = "golang-migrate"
	// Goose is github.com/pressly/goose (v3): one NNN_name.sql per migration with
	// "-- +goose Up" and "-- +goose Down" sections, each one statement block
	// (StatementBegin/StatementEnd), so that the plpgsql body's semicolons stay whole.
	Goose Tool = "goose"
	// Tern is github.com/jackc/tern (v2): one NNN_name.sql per migration, the up part
	// above "---- create above / drop below ----" and the down part below.
	Tern Tool = "tern"
)

// Tools lists every Tool, for callers (and tests) that cover them all.
func Tools() []Tool { return []Tool{GolangMigrate, Goose, Tern} }

// ternSeparator is the line tern splits a migration file at.
const ternSeparator = "---- create above / drop below ----"

// ToolFS returns the migrations as the files tool reads, at the root of the returned
// file system: every migration of All, made from the same embedded up and down files,
// so that each tool applies exactly what Migrate applies. The tool applies them in the
// schema its connection works in and keeps its own version table, which Migrate reads
// to adopt the schema later (see Migrator.Migrate). It fails on an unknown tool or an
// invalid embedded set (ErrInvalidSet).
func ToolFS(tool Tool) (fs.FS, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	return toolFS(tool, all)
}

// toolFS writes the migrations all in tool's layout.
func toolFS(tool Tool, all []Migration) (fs.FS, error) {
	out := fstest.MapFS{}
	file := func(name, body string) { out[name] = &fstest.MapFile{Data: []byte(body), Mode: 0o444} }
	for _, m := range all {
		base := fmt.Sprintf("%03d_%s", m.Version, m.Name)
		switch tool {
		case GolangMigrate:
			file(base+".up.sql", m.Up)
			file(base+".down.sql", m.Down)
		case Goose:
			file(base+".sql", "-- +goose Up\n-- +goose StatementBegin\n"+m.Up+"\n-- +goose StatementEnd\n\n"+
				"-- +goose Down\n-- +goose StatementBegin\n"+m.Down+"\n-- +goose StatementEnd\n")
		case Tern:
			file(base+".sql", m.Up+"\n"+ternSeparator+"\n"+m.Down)
		default:
			return nil, fmt.Errorf("migrations: unknown tool %q (known: %v)", tool, Tools())
		}
	}
	return out, nil
}
