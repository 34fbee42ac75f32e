package migrations

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNoCitus: Distribute was asked to distribute a table on a database without the
// citus extension.
var ErrNoCitus = errors.New("migrations: the database has no citus extension " +
	"(distributing needs Citus: CREATE EXTENSION citus on every node, then add the workers)")

// KeyTableDistributionColumn is the column the key table is distributed by.
const KeyTableDistributionColumn = "scope"

// DistributeOptions adjust Distribute.
type DistributeOptions struct {
	// ColocateWith names a distributed table to put the key table's shards beside, as
	// create_distributed_table's colocate_with: the application's table whose rows a
	// key guards (charges, say), distributed by the same text value the engine uses as
	// the scope. A name without a schema is resolved by the connection's search_path.
	// Defaults to "": Citus's default group for a text column, which colocates the key
	// table with every other table distributed by a text column with the default shard
	// count. "none" (Citus's keyword) makes a new group: the first of Tables starts it
	// and the others and the key table join it; without Tables the key table is alone
	// in it.
	//
	// DDL that creates shards in a group (create_distributed_table colocated with it,
	// a partition attached to one of its partitioned tables: the partitioned key
	// table's partitions ahead included) holds a share lock on the group's first table
	// for its whole transaction, and the partitioned key table's removal (a plain
	// DETACH on Citus) waits behind it when that table is the key table
	// (docs/PARTITIONS.md, "Citus 12.1"). Tables are distributed before the key table,
	// so in a new group one of them is first.
	ColocateWith string
	// Tables are the application's tables to distribute in the same transaction, in
	// order, before the key table: each is colocated with ColocateWith (the table
	// ColocateWith names itself with Citus's default group). One already distributed
	// is left as it is.
	Tables []Table
	// Local names tables that stay on the coordinator and that a phase's transaction
	// writes beside the key row: an outbox, River's job table (river_job). Each is
	// added to Citus's metadata as a local table (citus_add_local_table_to_metadata,
	// with the tables its foreign keys reach), which makes Citus commit a transaction
	// that writes it and a worker's shard with two-phase commit: the worker's part is
	// prepared, the coordinator's commit decides, and Citus's recovery finishes or
	// rolls back the worker's part after a crash. A plain table on the coordinator is
	// committed after the worker's part, in one phase, so a coordinator crash between
	// the two keeps the key row and loses the table's row (see docs/SCALING.md). One
	// already in the metadata is left as it is. Needs the coordinator in the metadata
	// (citus_set_coordinator_host).
	Local []string
}

// Table is an application's table for Distribute.
type Table struct {
	// Name is the table's name, as create_distributed_table reads it (resolved by the
	// connection's search_path unless qualified).
	Name string
	// Column is its distribution column: the value the engine uses as the scope.
	Column string
}

// Distribute makes the key table of the current schema a Citus distributed table,
// distributed by scope; see Migrator.Distribute.
func Distribute(ctx context.Context, db Beginner, opts *DistributeOptions) error {
	return currentSchema.Distribute(ctx, db, opts)
}

// Distribute makes m's key table a distributed table on Citus, sharded by scope
// (create_distributed_table) and colocated as opts says (nil: the defaults). Migrate
// first: the table must exist. A table already distributed is left as it is, so many
// processes may call Distribute at once at start-up: they wait for each other on the
// migration lock, and the later ones find nothing to do. It fails with an error
// wrapping ErrNoCitus when the database has no citus extension, changing nothing.
//
// Every statement the engine sends on one key then runs on the one shard that holds
// the key's scope. The application's tables that a flow's phases write must be
// distributed by the same value (the scope) and colocated with the key table, with
// that column in every primary key and unique constraint, so that a tx phase's
// writes and the key row's commit in one shard's transaction.
func (m *Migrator) Distribute(ctx context.Context, db Beginner, opts *DistributeOptions) error {
	if opts == nil {
		opts = &DistributeOptions{}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: distribute: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := m.lock(ctx, tx); err != nil {
		return err
	}
	var citus bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')`, simple).Scan(&citus); err != nil {
		return fmt.Errorf("migrations: distribute: %w", err)
	}
	if !citus {
		return ErrNoCitus
	}
	table := keyTable
	if m.schema != "" {
		table = pgx.Identifier{m.schema, keyTable}.Sanitize()
	}
	colocate := cmp.Or(opts.ColocateWith, "default")
	for _, t := range opts.Tables {
		with := colocate
		if t.Name == opts.ColocateWith {
			with = "default"
		}
		if err := distribute(ctx, tx, t.Name, t.Column, with); err != nil {
			return err
		}
		if colocate == "none" {
			// The first table started a group of its own; the rest join it.
			colocate = t.Name
		}
	}
	if err := allowPartitionedTrigger(ctx, tx, table); err != nil {
		return err
	}
	if err := distribute(ctx, tx, table, KeyTableDistributionColumn, colocate); err != nil {
		return err
	}
	for _, name := range opts.Local {
		if err := addLocal(ctx, tx, name); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: distribute: commit: %w", err)
	}
	return nil
}

// keyTable is the key table's name in its schema.
const keyTable = "idemflow_keys"

// distribute distributes table (an SQL name) by column, colocated with colocate,
// unless it is already distributed. It fails when the table does not exist.
func distribute(ctx context.Context, tx pgx.Tx, table, column, colocate string) error {
	var done bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = `+quoteLiteral(table)+`::regclass)`, simple).Scan(&done)
	if err != nil {
		return fmt.Errorf("migrations: distribute: is %s distributed (it must exist: run Migrate first): %w", table, err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT create_distributed_table(`+quoteLiteral(table)+`, `+quoteLiteral(column)+
		`, colocate_with => `+quoteLiteral(colocate)+`)`, simple); err != nil {
		return fmt.Errorf("migrations: distribute %s by %s (colocated with %s): %w", table, column, colocate, err)
	}
	return nil
}

// addLocal adds table (an SQL name) on the coordinator to Citus's metadata as a local
// table, with the tables its foreign keys reach, unless it is in the metadata already.
func addLocal(ctx context.Context, tx pgx.Tx, table string) error {
	var done bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = `+quoteLiteral(table)+`::regclass)`, simple).Scan(&done)
	if err != nil {
		return fmt.Errorf("migrations: distribute: is %s in Citus's metadata (it must exist): %w", table, err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT citus_add_local_table_to_metadata(`+quoteLiteral(table)+`, cascade_via_foreign_keys => true)`, simple); err != nil {
		return fmt.Errorf("migrations: add %s to Citus's metadata as a local table: %w", table, err)
	}
	return nil
}

// allowPartitionedTrigger lets tx distribute the key table when it is the partitioned
// layout that PartitionedToolFS's files make: that table carries a statement trigger
// (idemflow_keys_read_committed, which refuses a claim outside READ COMMITTED), and
// Citus distributes a table with a trigger only with citus.enable_unsafe_triggers, set
// here for tx alone. The trigger reads no table, so it is safe on the shards, where it
// fires in the worker's transaction, at the coordinator's isolation level; store's
// SetupPartitioned sets the same when it distributes the layout itself.
func allowPartitionedTrigger(ctx context.Context, tx pgx.Tx, table string) error {
	_, err := tx.Exec(ctx, `SELECT set_config('citus.enable_unsafe_triggers', 'on', true)
		FROM pg_catalog.pg_class WHERE oid = to_regclass(`+quoteLiteral(table)+`) AND relkind = 'p'`, simple)
	if err != nil {
		return fmt.Errorf("migrations: distribute the partitioned %s: %w", table, err)
	}
	return nil
}
