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

// citusDistribution is how Citus distributes a key table: by column, in a colocation
// group of shards shards, each placed replicas times. When the group is the default one
// for its kind (the one create_distributed_table picks for colocate_with 'default'),
// colocate is "default"; otherwise it is another table of the group, or "none" when the
// key table was alone in a group of its own (which the new table keeps).
type citusDistribution struct {
	column, colocate string
	shards, replicas int
}

// sqlCitusDistribution reads, for the distributed table $1 (as to_regclass reads
// it), its distribution column, its colocation group's shard count and replication
// factor, whether that group is the default one (the lowest-numbered group of that
// shard count, replication factor and column type outside a tenant schema, as Citus
// picks it), and another table of its colocation group, if any (one of the key
// table's own schema first), with whether it is in that schema.
//
// The colocation group's row can be missing (seen on Citus 12.1 when another schema's
// set-up committed while this one waited for the set-up lock: the table still names
// the group in pg_dist_partition): the shard count and replication factor are then
// read from the table's own shards and placements, and the group taken as the default
// one. Reading no row there would leave the new partitioned key table on the
// coordinator alone, not distributed (TestPartitionedExportByEachTool on Citus found it).
const sqlCitusDistribution = `SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey),
	coalesce(c.shardcount, sh.shards), coalesce(c.replicationfactor, sh.placements / greatest(sh.shards, 1)),
	c.colocationid IS NULL OR p.colocationid = (SELECT min(d.colocationid) FROM pg_dist_colocation d
		WHERE (d.shardcount, d.replicationfactor, d.distributioncolumntype, d.distributioncolumncollation)
				= (c.shardcount, c.replicationfactor, c.distributioncolumntype, c.distributioncolumncollation)
			AND NOT EXISTS (SELECT 1 FROM pg_dist_schema s WHERE s.colocationid = d.colocationid)),
	coalesce(o.name, ''), coalesce(o.same_schema, false)
FROM pg_dist_partition p LEFT JOIN pg_dist_colocation c ON c.colocationid = p.colocationid
	LEFT JOIN LATERAL (SELECT o.logicalrelid::text AS name, oc.relnamespace = pc.relnamespace AS same_schema
		FROM pg_dist_partition o JOIN pg_catalog.pg_class oc ON oc.oid = o.logicalrelid,
			pg_catalog.pg_class pc
		WHERE pc.oid = p.logicalrelid AND o.colocationid = p.colocationid AND o.logicalrelid <> p.logicalrelid
			AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = o.logicalrelid)
		ORDER BY oc.relnamespace <> pc.relnamespace, o.logicalrelid LIMIT 1) o ON true
	CROSS JOIN LATERAL (SELECT count(DISTINCT s.shardid)::int AS shards, count(pl.placementid)::int AS placements
		FROM pg_dist_shard s LEFT JOIN pg_dist_placement pl ON pl.shardid = s.shardid
		WHERE s.logicalrelid = p.logicalrelid) sh
WHERE p.logicalrelid = to_regclass($1) AND p.partmethod = 'h'`

// readCitusDistribution returns how Citus distributes l's key table, or nil when
// the database has no citus extension or the table is not a distributed table.
func readCitusDistribution(ctx context.Context, tx pgx.Tx, l *partitionLayout) (*citusDistribution, error) {
	var citus bool
	if err := queryRow(ctx, tx, []any{&citus}, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')`); err != nil || !citus {
		return nil, err
	}
	// The set-up reads and changes the distributed table (the emptiness check, the
	// rename, the drop) and then creates the trigger's function in the same
	// transaction, which Citus refuses after a parallel operation on a distributed
	// table: one connection per worker instead, from the transaction's first
	// statement on Citus.
	if _, err := tx.Exec(ctx, `SET LOCAL citus.multi_shard_modify_mode = 'sequential'`); err != nil {
		return nil, err
	}
	if err := lockCitusSetup(ctx, tx); err != nil {
		return nil, err
	}
	d := &citusDistribution{}
	var isDefault, sameSchema bool
	err := queryRow(ctx, tx, []any{&d.column, &d.shards, &d.replicas, &isDefault, &d.colocate, &sameSchema}, sqlCitusDistribution, l.ident(keyTable))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the key table's distribution: %w", err)
	}
	switch {
	case d.colocate == "" && !isDefault:
		// Alone in a group of its own (distributed with colocate_with 'none'): the new
		// table gets one too. Joining the default group instead would share it with
		// every other table distributed by text, whose DDL then locks the key table
		// (Citus locks a group's first table while it creates shards in the group)
		// and holds up the removal's plain detach.
		d.colocate = "none"
	case d.colocate == "":
		d.colocate = "default"
	case isDefault && !sameSchema:
		// Named by its kind, not by another table: a table of another schema could be
		// dropped (its schema with it) before the distribution resolves its name. A
		// table of the key table's own schema is named even in the default group, so
		// that the new table's group never depends on which group is the default when
		// create_distributed_table runs. (A Citus run of TestPartitionsUnderTraffic
		// once saw the new table in another group. Not explained: Citus 12.1 takes the
		// lowest-numbered matching group outside tenant schemas, as this query does.)
		d.colocate = "default"
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
	var err error
	if d.colocate == "default" || d.colocate == "none" {
		// The default group, or a new one, of the old table's shard count and
		// replication factor, whatever the session's citus.shard_count and
		// citus.shard_replication_factor.
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL citus.shard_replication_factor = %d`, d.replicas)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, $2, colocate_with => $3, shard_count => $4)`,
			l.ident(keyTable), d.column, d.colocate, d.shards)
	} else {
		_, err = tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)`,
			l.ident(keyTable), d.column, d.colocate)
	}
	if err != nil {
		return fmt.Errorf("distribute the partitioned key table by %s (colocated with %s): %w", d.column, d.colocate, err)
	}
	return nil
}

// citusSetupLockSalt is the id of the advisory lock that serialises set-ups of the
// partitioned layout on a Citus coordinator: "idemcitu" in ASCII.
const citusSetupLockSalt int64 = 0x6964656d63697475

// citusSetupLockWait bounds the wait for another set-up to end (set-ups are rare, and
// one takes seconds on a cluster).
const citusSetupLockWait = "60s"

// lockCitusSetup takes, in tx, the lock that lets one set-up of the partitioned layout
// run at a time on the coordinator, before the set-up locks any table. Distributing a
// table makes Citus lock a table of the colocation group it joins (one it picks), and a
// set-up holds the ACCESS EXCLUSIVE lock of its old key table, a table of that group,
// from the rename until it commits: two set-ups in one group (the key tables of two
// schemas, say) could each wait for the other's table, a deadlock that Citus ends by
// cancelling one of them.
func lockCitusSetup(ctx context.Context, tx pgx.Tx) error {
	for _, sql := range []string{
		`SET LOCAL lock_timeout = '` + citusSetupLockWait + `'`,
		fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, citusSetupLockSalt),
		`SET LOCAL lock_timeout = '` + partitionLockTimeout + `'`,
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("wait for another set-up on the Citus coordinator: %w", err)
		}
	}
	return nil
}
