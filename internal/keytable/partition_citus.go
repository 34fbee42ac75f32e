package keytable

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The partitioned key table on Citus (docs/PARTITIONS.md, "Citus 12.1"). A key table
// that Citus distributes stays distributed when SetupPartitioned turns it into the
// partitioned layout: the new partitioned table is distributed by the same column and
// colocated with the tables the old one was colocated with. Partitions created later
// need nothing more: Citus distributes a plain table as it is attached to a
// distributed parent (create, then attach, as on plain PostgreSQL). Removal detaches
// with the plain statement under a short lock timeout (detachBounded): Citus 12.1
// refuses DETACH … CONCURRENTLY.

// citusDistribution is how Citus distributes a key table: by column, colocated with
// colocate (a table of the old key table's colocation group, or "default" when the
// key table was alone in it).
type citusDistribution struct {
	column, colocate string
}

// sqlCitusDistribution reads, for the distributed table $1 (as to_regclass reads
// it), its distribution column and another table of its colocation group, if any.
const sqlCitusDistribution = `SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey),
	coalesce((SELECT o.logicalrelid::text FROM pg_dist_partition o
		WHERE o.colocationid = p.colocationid AND o.logicalrelid <> p.logicalrelid
			AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = o.logicalrelid)
		ORDER BY o.logicalrelid LIMIT 1), 'default')
FROM pg_dist_partition p WHERE p.logicalrelid = to_regclass($1) AND p.partmethod = 'h'`

// readCitusDistribution returns how Citus distributes l's key table, or nil when
// the database has no citus extension or the table is not a distributed table.
func readCitusDistribution(ctx context.Context, tx pgx.Tx, l *partitionLayout) (*citusDistribution, error) {
	var citus bool
	if err := queryRow(ctx, tx, []any{&citus}, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')`); err != nil || !citus {
		return nil, err
	}
	d := &citusDistribution{}
	err := queryRow(ctx, tx, []any{&d.column, &d.colocate}, sqlCitusDistribution, l.ident(keyTable))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the key table's distribution: %w", err)
	}
	// The set-up reads and changes the distributed table (the emptiness check, the
	// rename, the drop) and then creates the trigger's function in the same
	// transaction, which Citus refuses after a parallel operation on a distributed
	// table: one connection per worker instead.
	if _, err := tx.Exec(ctx, `SET LOCAL citus.multi_shard_modify_mode = 'sequential'`); err != nil {
		return nil, err
	}
	return d, nil
}

// distribute distributes l's new partitioned key table, in tx, as d says (nothing when
// d is nil). The table has no partitions yet. Its statement trigger
// (readCommittedOnly) is carried to the shards, which Citus allows only with
// citus.enable_unsafe_triggers: the trigger reads no table, so it is safe.
func (d *citusDistribution) distribute(ctx context.Context, tx pgx.Tx, l *partitionLayout) error {
	if d == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, `SET LOCAL citus.enable_unsafe_triggers = on`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)`,
		l.ident(keyTable), d.column, d.colocate)
	if err != nil {
		return fmt.Errorf("distribute the partitioned key table by %s (colocated with %s): %w", d.column, d.colocate, err)
	}
	return nil
}
