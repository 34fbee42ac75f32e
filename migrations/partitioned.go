package migrations

import (
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// The partitioned key table in the migration tools' formats (docs/PARTITIONS.md). The
// engine's own path is Migrate, then store's SetupPartitioned, which replaces the empty
// migrated table by a partitioned one. A tool cannot call Go, so its files make the
// table partitioned from its first migration instead: 001 creates idemflow_keys
// partitioned by range of created_at, with the same columns, checks and indexes, the
// trigger that refuses a claim outside READ COMMITTED, and the first partitions; every
// later file is the embedded one, unchanged, and runs on either layout (ALTER TABLE and
// CREATE INDEX recurse to the partitions). So the first file of a partitioned set never
// changes between releases, and a team that keeps the exported files adds only the new
// ones. migrations/tooltest checks, with each real tool, that the result is the table
// SetupPartitioned makes.

// The widths a partitioned set may have: those of store (PartitionWeek, PartitionDay,
// PartitionHour), or any width that divides a day into whole minutes.
const (
	PartitionWeek = 7 * 24 * time.Hour
	PartitionDay  = 24 * time.Hour
	PartitionHour = time.Hour
)

// The partitioned table's first file is made from 001's text: these are the two places
// it changes. Partitioned finds each exactly once, or fails.
const (
	plainPrimaryKey       = "    PRIMARY KEY (scope, idempotency_key),\n"
	partitionedPrimaryKey = "    PRIMARY KEY (scope, idempotency_key, created_at),\n"
	plainTableEnd         = "\n);\n"
	partitionedTableEnd   = "\n) PARTITION BY RANGE (created_at);\n"
)

// readCommittedOnly is the trigger the partitioned layout carries (store's
// SetupPartitioned creates the same): without a unique index across partitions, one
// row per (scope, key) rests on the claim lock and a look-up in a snapshot taken after
// it, which REPEATABLE READ and SERIALIZABLE do not give.
const readCommittedOnly = `
-- The partitioned layout has no unique index across partitions: one row per (scope,
-- key) rests on the claim lock and a look-up in a snapshot taken after it, which
-- REPEATABLE READ and SERIALIZABLE do not give. So key rows are inserted at READ
-- COMMITTED only (docs/PARTITIONS.md).
CREATE FUNCTION idemflow_keys_read_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'idemflow: key rows of a partitioned key table are inserted at READ COMMITTED only, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000', HINT = 'a flow whose first phase runs at REPEATABLE READ or SERIALIZABLE cannot claim keys on this layout (docs/PARTITIONS.md)';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER idemflow_keys_read_committed BEFORE INSERT ON idemflow_keys
    FOR EACH STATEMENT EXECUTE FUNCTION idemflow_keys_read_committed();
`

// createPartitions is the block that creates the first partitions, from the one holding
// the database's now to the one holding now plus ahead, each created and then attached,
// named by its lower bound in UTC as store names them. Its verbs: the width and ahead
// as intervals, the lower bound of the current partition (an SQL expression), and the
// to_char format of a name.
const createPartitions = `
-- The first partitions, from the current one to %[2]s ahead, of width %[1]s, aligned
-- in UTC and named by their lower bound, as store's EnsurePartitions names them. From
-- then on every sweeper's pass creates the partitions ahead and removes those past
-- retention (docs/PARTITIONS.md).
DO $$
DECLARE
    width constant interval := '%[1]s';
    stop  constant timestamptz := now() + interval '%[2]s';
    lower timestamptz := %[3]s;
    name  text;
BEGIN
    WHILE lower <= stop LOOP
        name := 'idemflow_keys_p' || to_char(lower AT TIME ZONE 'UTC', '%[4]s');
        EXECUTE format('CREATE TABLE %%I (LIKE idemflow_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE idemflow_keys ATTACH PARTITION %%I FOR VALUES FROM (%%L) TO (%%L)',
            name, lower, lower + width);
        lower := lower + width;
    END LOOP;
END
$$;
`

// Partitioned returns the migrations for the partitioned key table with partitions of
// width w: All, but for the first, which creates the table partitioned (see the
// package documentation of this layout above). It fails on a width that is not a week
// and does not divide a day into whole minutes, or when 001's text is not the one it
// knows how to change.
func Partitioned(w time.Duration) ([]Migration, error) {
	if w != PartitionWeek && (w < time.Minute || w%time.Minute != 0 || (24*time.Hour)%w != 0) {
		return nil, fmt.Errorf("migrations: partition width %s is not a week and does not divide a day into whole minutes", w)
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	first := &all[0]
	for _, r := range [][2]string{{plainPrimaryKey, partitionedPrimaryKey}, {plainTableEnd, partitionedTableEnd}} {
		if n := strings.Count(first.Up, r[0]); n != 1 {
			return nil, fmt.Errorf("%w: %03d_%s.up.sql has %q %d times, not once", ErrInvalidSet, first.Version, first.Name, r[0], n)
		}
		first.Up = strings.Replace(first.Up, r[0], r[1], 1)
	}
	// Ahead as store's default: a week for widths of an hour or more, ten partitions
	// for narrower ones.
	ahead, lower, format := "168 hours", fmt.Sprintf("to_timestamp(floor(extract(epoch FROM now()) / %[1]d) * %[1]d)", int64(w/time.Second)), "YYYYMMDDHH24MI"
	switch {
	case w == PartitionWeek:
		lower, format = "date_trunc('week', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'", "YYYYMMDD"
	case w%PartitionDay == 0:
		format = "YYYYMMDD"
	case w%time.Hour == 0:
		format = "YYYYMMDDHH24"
	}
	if w < time.Hour {
		ahead = fmt.Sprintf("%d minutes", 10*int64(w/time.Minute))
	}
	first.Up += readCommittedOnly + fmt.Sprintf(createPartitions, fmt.Sprintf("%d minutes", int64(w/time.Minute)), ahead, lower, format)
	// DROP TABLE drops the partitions and the trigger; the trigger's function is left.
	first.Down += "DROP FUNCTION IF EXISTS idemflow_keys_read_committed();\n"
	return all, nil
}

// PartitionedToolFS is ToolFS for the partitioned key table with partitions of width
// w: the files of Partitioned in tool's layout. The first file creates the partitions
// from the one holding the database's now, as the tool applies it, to a week ahead
// (ten partitions for widths under an hour); the sweeper's pass maintains them from
// then on. Migrate adopts a schema a tool migrated from these files as it adopts one
// from ToolFS's, and later releases' files (the same in both sets) apply to it.
//
// On Citus, distribute the table after the tool has created it (Distribute), before
// traffic: it distributes the partitioned table and its partitions by scope, as
// SetupPartitioned does for a table distributed first.
func PartitionedToolFS(tool Tool, w time.Duration) (fs.FS, error) {
	all, err := Partitioned(w)
	if err != nil {
		return nil, err
	}
	return toolFS(tool, all)
}
