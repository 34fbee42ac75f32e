package keytable

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The partitioned layout's maintenance statements, and only them (docs/PARTITIONS.md):
// the catalog look-ups, the maintenance lock, and the DDL that sets the layout up,
// creates partitions ahead and removes those past retention (partition_maint.go sends
// them). The DDL names tables, so it is built from quoted identifiers (the layout's
// ident); nothing else is spliced into it. The per-key statements a partitioned key
// table adds to the key row's are in partition.go beside the addressing they need.

// The catalog look-ups. $1 is the key table's name as to_regclass reads it. The first
// also asks whether the database has the citus extension (SendExplicit). The second
// deparses the partitions' bounds with no relation (0): given one, pg_get_expr locks
// it, and the listing would wait behind a removal's drop or locked probes of a
// detached table still listed pending, or close a deadlock with another removal's
// DETACH … FINALIZE; a bound holds only constants, which print the same either way.
const (
	sqlPartitionTable = `SELECT n.nspname, c.relkind = 'p', statement_timestamp(),
	EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
	sqlPartitions = `SELECT c.relname,
	(regexp_match(pg_catalog.pg_get_expr(c.relpartbound, 0), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
	(regexp_match(pg_catalog.pg_get_expr(c.relpartbound, 0), 'TO \(''([^'']+)''\)'))[1]::timestamptz,
	i.inhdetachpending
FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)
ORDER BY 2 NULLS FIRST`
	sqlPartitionOrphans = `SELECT c.relname
FROM pg_catalog.pg_class c
WHERE c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = to_regclass($1))
	AND c.relkind = 'r' AND c.relname LIKE $2 || '%'
	AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid)
ORDER BY 1`
)

// sqlScanLayout asks whether the database has the citus extension and whether the key
// table ($1, as to_regclass reads it) is partitioned.
const sqlScanLayout = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'),
	coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`

// sqlPartitionLock takes the key table's maintenance lock if it is free, for the
// transaction; $1 is the table's name as to_regclass reads it, $2 partitionLockSalt.
const sqlPartitionLock = `SELECT pg_try_advisory_xact_lock($2::bigint # to_regclass($1)::oid::bigint)`

// sqlPartitionLockTimeout bounds every lock wait of a maintenance transaction.
const sqlPartitionLockTimeout = `SET LOCAL lock_timeout = '` + partitionLockTimeout + `'`

// sqlIndexDefs lists the definitions of the table $1's indexes but its primary key.
const sqlIndexDefs = `SELECT pg_catalog.pg_get_indexdef(indexrelid) FROM pg_catalog.pg_index
WHERE indrelid = to_regclass($1) AND NOT indisprimary ORDER BY indexrelid`

// sqlHasRows asks whether the table has a row.
func sqlHasRows(table string) string { return `SELECT EXISTS (SELECT 1 FROM ` + table + `)` }

// sqlRepartition replaces the empty key table (table; old is its name once renamed)
// by a partitioned one with the same columns, defaults, checks and comments, and the
// primary key (scope, idempotency_key, created_at).
func sqlRepartition(table, old string) []string {
	return []string{
		`ALTER TABLE ` + table + ` RENAME TO ` + pgx.Identifier{keyTable + "_unpartitioned"}.Sanitize(),
		`CREATE TABLE ` + table + ` (LIKE ` + old + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS)
	PARTITION BY RANGE (created_at)`,
		`DROP TABLE ` + old,
		`ALTER TABLE ` + table + ` ADD CONSTRAINT ` + pgx.Identifier{keyTable + "_pkey"}.Sanitize() +
			` PRIMARY KEY (scope, idempotency_key, created_at)`,
	}
}

// sqlReadCommittedOnly is the function fn and the statement trigger on table that
// refuse an insert outside READ COMMITTED (see readCommittedOnly).
func sqlReadCommittedOnly(fn, table string) []string {
	trigger := pgx.Identifier{keyTable + "_read_committed"}.Sanitize()
	return []string{`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'idemflow: key rows of a partitioned key table are inserted at READ COMMITTED only, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000', HINT = 'a flow whose first phase runs at REPEATABLE READ or SERIALIZABLE cannot claim keys on this layout (docs/PARTITIONS.md)';
    END IF;
    RETURN NULL;
END
$$`,
		`CREATE TRIGGER ` + trigger + ` BEFORE INSERT ON ` + table + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `()`,
	}
}

// sqlCreatePartition creates the table part like the key table table.
func sqlCreatePartition(part, table string) string {
	return `CREATE TABLE ` + part + ` (LIKE ` + table + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`
}

// sqlAttach attaches the table part as the partition [from, to) of table.
func sqlAttach(table, part string, from, to time.Time) string {
	return `ALTER TABLE ` + table + ` ATTACH PARTITION ` + part +
		` FOR VALUES FROM (` + boundLiteral(from) + `) TO (` + boundLiteral(to) + `)`
}

// sqlDetach detaches the partition part of table; how is "", "CONCURRENTLY" or
// "FINALIZE".
func sqlDetach(table, part, how string) string {
	sql := `ALTER TABLE ` + table + ` DETACH PARTITION ` + part
	if how != "" {
		sql += ` ` + how
	}
	return sql
}

// The settings of the plain detach on Citus: the transaction's SET LOCAL commands go to
// the workers with the detach (on plain PostgreSQL the first is a placeholder), and
// the lock wait is bounded in ms.
const sqlCitusPropagateLocal = `SET LOCAL citus.propagate_set_commands = 'local'`

func sqlLockTimeoutMs(d time.Duration) string {
	return fmt.Sprintf(`SET LOCAL lock_timeout = %d`, d.Milliseconds())
}

// sqlLockExclusive takes the ACCESS EXCLUSIVE lock of the table part.
func sqlLockExclusive(part string) string { return `LOCK TABLE ` + part + ` IN ACCESS EXCLUSIVE MODE` }

// sqlDropTable drops the table part.
func sqlDropTable(part string) string { return `DROP TABLE ` + part }

// sqlSheddable lists the indexes of the table $1 that holdsLiveKeysProbe does not use
// (all but those whose predicate is the unfinished or the dead-lettered status), with
// the constraint each backs, if any, largest first.
const sqlSheddable = `SELECT ic.relname, coalesce(con.conname, '')
FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
LEFT JOIN pg_catalog.pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
WHERE i.indrelid = to_regclass($1)
	AND coalesce(pg_catalog.pg_get_expr(i.indpred, i.indrelid) !~ '''(in_progress|dead)''', true)
ORDER BY pg_catalog.pg_relation_size(i.indexrelid) DESC, ic.relname`

// sqlShed drops the index (or, when it backs one, the constraint) of the table part.
func sqlShed(part, index, constraint string) string {
	if constraint != "" {
		return `ALTER TABLE ` + part + ` DROP CONSTRAINT ` + pgx.Identifier{constraint}.Sanitize()
	}
	return `DROP INDEX ` + index
}

// sqlLiveProbe asks whether the table part holds an unfinished or a dead-lettered key:
// two index probes.
func sqlLiveProbe(part string) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + part + ` WHERE status = 'in_progress')
	OR EXISTS (SELECT 1 FROM ` + part + ` WHERE status = 'dead')`
}

// sqlLive is sqlLiveProbe, and whether part holds a key in a status a newer release
// wrote: run with sqlConstraintExclusion, the planner refutes the last from the
// table's validated status check without reading a row.
func sqlLive(part string) string {
	return sqlLiveProbe(part) + `
	OR EXISTS (SELECT 1 FROM ` + part + ` WHERE status NOT IN ('in_progress', 'finished', 'dead'))`
}

const sqlConstraintExclusion = `SET LOCAL constraint_exclusion = on`

// sqlRelationGone says whether the relation $1 (as to_regclass reads it) no longer
// exists.
const sqlRelationGone = `SELECT to_regclass($1) IS NULL`
