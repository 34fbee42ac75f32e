// Package migrations holds idemflow's SQL schema as numbered, embedded migration files
// and a small migrator that applies them.
//
// The files are named NNN_name.up.sql and NNN_name.down.sql, the form that
// golang-migrate, goose (with its sql annotations added by hand) and most other tools
// read as they are, so a team that already runs a migration tool can apply them with it
// instead of calling Migrate.
//
// Usage:
//
//	if err := migrations.Migrate(ctx, pool); err != nil {
//		return fmt.Errorf("migrate: %w", err)
//	}
//
// Tables are created in the current schema (the first entry of the connection's
// search_path). Migrate is safe to call from many processes at once: it serialises them
// with a transaction-scoped advisory lock and applies every pending file in one
// transaction, so a process that crashes midway leaves nothing half-applied.
//
// This package imports none of idemflow's other packages.
package migrations
