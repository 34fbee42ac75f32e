// Package migrations holds idemflow's SQL schema as numbered, embedded migration files
// and a small migrator that applies them.
//
// The files are named NNN_name.up.sql and NNN_name.down.sql. A team that already runs a
// migration tool applies them with it instead of calling Migrate: ToolFS writes them in
// the layout of golang-migrate, goose or tern, made from the same files, so every
// migration ships in every format.
//
// Usage:
//
//	if err := migrations.Migrate(ctx, pool); err != nil {
//		return fmt.Errorf("migrate: %w", err)
//	}
//
// Tables are created in the current schema (the first entry of the connection's
// search_path), or in the schema a Migrator is given (Config.Schema), which the engine
// then names in every statement (workflow.Config.Schema). Migrate is safe to call from
// many processes at once: it serialises them with a transaction-scoped advisory lock
// and applies every pending file in one transaction, so a process that crashes midway
// leaves nothing half-applied. It uses no session state, so it works behind a pooler in
// transaction mode.
//
// Each file is sent one statement at a time (Citus refuses several commands in one
// query on a distributed table: "cannot insert multiple commands into a prepared
// statement"), still in that one transaction, with the version recorded in it too.
// On Citus the transaction runs in sequential mode (citus.multi_shard_modify_mode),
// which lets a DDL statement on the distributed key table share the transaction with
// the statements before and after it, and Citus commits DDL that reaches the workers
// with two-phase commit: the workers' part is prepared, the coordinator's commit (the
// version row included) decides, and Citus's recovery of prepared transactions
// finishes or rolls back the workers' part after a crash. So a failure or a crash
// leaves either the whole migration and its version row or neither, on Citus too;
// calling Migrate again applies what is missing.
//
// A schema that a tool migrated from ToolFS's files is adopted by Migrate: it reads the
// tool's version table, records the versions applied there in its own, and applies the
// rest. A key table that nothing accounts for is refused with ErrUnknownState, changing
// nothing; Baseline records its version.
//
// This package imports none of idemflow's other packages.
package migrations
