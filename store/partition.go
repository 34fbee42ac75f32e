package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The partitioned key table, an option (docs/PARTITIONS.md): idemflow_keys partitioned
// by range of created_at, in partitions of a fixed width aligned in UTC, created ahead
// and removed whole once past retention. This file holds its set-up and maintenance;
// their statements are built here with every name quoted and qualified by the key
// table's schema (qualify's plain substitution would also rewrite the partitions' and
// indexes' names, which begin with the table's).

// Widths a partitioned key table may have. A week, or any width that divides a day
// into whole minutes; these are the ones documented.
const (
	// PartitionWeek: partitions from Monday 00:00 UTC to the next, for long retentions
	// (fewer partitions: each statement's cost grows with how many the table has).
	PartitionWeek   = 7 * 24 * time.Hour
	PartitionDay    = 24 * time.Hour
	PartitionHour   = time.Hour
	PartitionMinute = time.Minute // for tests that cross boundaries
	// partitionsAheadDefault is how far ahead EnsurePartitions creates partitions of
	// an hour or more; narrower ones (tests) are created partitionsAheadNarrow ahead.
	partitionsAheadDefault = 7 * 24 * time.Hour
	partitionsAheadNarrow  = 10
	// partitionLockTimeout bounds how long a maintenance statement waits for a lock
	// (another maintenance step, a VACUUM). Live statements never wait on it: see
	// docs/PARTITIONS.md.
	partitionLockTimeout = "5s"
)

var (
	// ErrNotPartitioned: the key table is not partitioned (EnsurePartitions,
	// RemovePartitions), or SetupPartitioned was asked for a key table that is missing.
	ErrNotPartitioned = errors.New("key table is not partitioned")
	// ErrNotEmpty: SetupPartitioned found rows in the key table. A table with rows is
	// moved by the procedure in docs/PARTITIONS.md.
	ErrNotEmpty = errors.New("key table is not empty")
	// ErrScanSingleOnPartitioned: a Store made with ScanSingle was used on a
	// partitioned key table, where ctid is unique only within a partition.
	ErrScanSingleOnPartitioned = errors.New("scan single matches rows by ctid, which a partitioned key table does not allow")
	// ErrLiveKeysInDetached: a partition detached for removal held an unfinished or
	// dead-lettered key after all; it was attached back, not dropped.
	ErrLiveKeysInDetached = errors.New("detached partition holds unfinished or dead-lettered keys")
)

// PartitionDB runs maintenance: statements outside a transaction (a concurrent detach
// cannot run in one) and transactions. *pgxpool.Pool and *pgx.Conn satisfy it.
type PartitionDB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Partition is one partition of a partitioned key table.
type Partition struct {
	Name string
	// From and To are the partition's bounds (To excluded); nil for MINVALUE and
	// MAXVALUE (a table moved to the layout is attached from MINVALUE).
	From, To *time.Time
	// DetachPending: a concurrent detach of it began and did not finish.
	DetachPending bool
}

// PartitionReport is what one maintenance step did.
type PartitionReport struct {
	// Ahead is how many partitions begin after the database clock's now.
	Ahead int
	// Created, Removed: partitions created (or attached) and dropped by this step.
	Created, Removed int
	// Kept counts partitions past retention that were kept: they hold an unfinished
	// or dead-lettered key.
	Kept int
	// Busy: another process held the maintenance lock; nothing was created.
	Busy bool
	// Stall, on Citus only (no concurrent detach there), is the longest plain detach
	// of the step: how long a live statement on the key table may have waited behind
	// it (bounded by a 200 ms lock timeout plus the detach itself; docs/PARTITIONS.md).
	Stall time.Duration
	// Want is how many partitions the default ahead calls for: a warning is due when
	// fewer than half as many are Ahead (Low).
	Want int
}

// Low reports whether too few partitions exist ahead: fewer than half of Want. A row
// whose creation time has no partition cannot be inserted (its claim fails with a
// retryable error), so this is worth a warning.
func (r PartitionReport) Low() bool { return r.Ahead*2 < r.Want }

// defaultAhead is how far ahead partitions of width w are created by default.
func defaultAhead(w time.Duration) time.Duration {
	if w < time.Hour {
		return partitionsAheadNarrow * w
	}
	return partitionsAheadDefault
}

// partitionLayout is what the catalog says of the key table.
type partitionLayout struct {
	schema      string // the key table's schema, as the catalog names it
	partitioned bool
	parts       []Partition // attached or detach pending, oldest first
	orphans     []string    // tables named as partitions, in the schema, attached to nothing
	now         time.Time   // the database clock
}

// tableName is the key table's name as the catalog looks it up: qualified when the
// Store has a schema.
func (s *Store) tableName() string {
	if s.part.schema == "" {
		return keyTable
	}
	return pgx.Identifier{s.part.schema, keyTable}.Sanitize()
}

// partStatements is what a Store keeps for its partitioned layout.
type partStatements struct {
	schema string // the Store's schema option; "" is the search_path's
}

func newPartStatements(schema string) partStatements { return partStatements{schema: schema} }

// The catalog look-ups. $1 is the key table's name as to_regclass reads it.
const (
	sqlPartitionTable = `SELECT n.nspname, c.relkind = 'p', statement_timestamp()
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
	sqlPartitions = `SELECT c.relname,
	(regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
	(regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz,
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

// partitionPrefix begins the name of every partition the Store creates; the rest is
// the lower bound in UTC (see partitionName).
const partitionPrefix = keyTable + "_p"

// layout reads the key table's layout from the catalog, on db (a transaction when the
// caller holds the maintenance lock).
func (s *Store) layout(ctx context.Context, db DBTX) (*partitionLayout, error) {
	l := &partitionLayout{}
	err := queryRow(ctx, db, []any{&l.schema, &l.partitioned, &l.now}, sqlPartitionTable, s.tableName())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s does not exist (run the migrations first)", ErrNotPartitioned, s.tableName())
	}
	if err != nil || !l.partitioned {
		return l, Classify(err)
	}
	rows, err := db.Query(ctx, sqlPartitions, s.tableName())
	if err != nil {
		return nil, Classify(err)
	}
	var p Partition
	_, err = pgx.ForEachRow(rows, []any{&p.Name, &p.From, &p.To, &p.DetachPending}, func() error {
		l.parts = append(l.parts, p)
		return nil
	})
	if err != nil {
		return nil, Classify(err)
	}
	rows, err = db.Query(ctx, sqlPartitionOrphans, s.tableName(), strings.ReplaceAll(partitionPrefix, "_", `\_`))
	if err != nil {
		return nil, Classify(err)
	}
	l.orphans, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return l, Classify(err)
}

// Partitions lists the key table's partitions, oldest first. It returns
// ErrNotPartitioned when the key table is not partitioned.
func (s *Store) Partitions(ctx context.Context, db DBTX) ([]Partition, error) {
	l, err := s.layout(ctx, db)
	switch {
	case err != nil:
		return nil, fmt.Errorf("list partitions: %w", err)
	case !l.partitioned:
		return nil, fmt.Errorf("list partitions: %w", ErrNotPartitioned)
	}
	return l.parts, nil
}

// ident is a quoted name in the key table's schema.
func (l *partitionLayout) ident(name string) string {
	return pgx.Identifier{l.schema, name}.Sanitize()
}

// width is the width of the newest partition with both bounds: the width the table
// was set up with.
func (l *partitionLayout) width() (time.Duration, error) {
	for i := len(l.parts) - 1; i >= 0; i-- {
		if p := l.parts[i]; p.From != nil && p.To != nil {
			return p.To.Sub(*p.From), nil
		}
	}
	return l.orphanWidth()
}

// orphanWidth is the width of the layout's detached partitions, when none is attached:
// a day or an hour by their names' form (a week when day-named ones are a week
// apart), else the smallest gap between two of them (a minute when there is only one).
func (l *partitionLayout) orphanWidth() (time.Duration, error) {
	var starts []time.Time
	for _, o := range l.orphans {
		if t, ok := partitionStart(o); ok {
			starts = append(starts, t)
		}
	}
	if len(starts) == 0 {
		return 0, errors.New("no partition, attached or detached, to learn the width from")
	}
	slices.SortFunc(starts, time.Time.Compare)
	gap := PartitionWeek // the smallest gap between two starts, up to a week
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d > 0 && d < gap {
			gap = d
		}
	}
	switch len(strings.TrimPrefix(l.orphans[0], partitionPrefix)) {
	case len("20060102"):
		if len(starts) > 1 && gap == PartitionWeek {
			return PartitionWeek, nil
		}
		return 24 * time.Hour, nil
	case len("2006010215"):
		return time.Hour, nil
	}
	w := min(gap, 24*time.Hour)
	if len(starts) == 1 {
		w = time.Minute
	}
	return w, nil
}

// overlaps reports whether an attached partition overlaps [from, from+w).
func (l *partitionLayout) overlaps(from time.Time, w time.Duration) bool {
	to := from.Add(w)
	for _, p := range l.parts {
		if (p.From == nil || p.From.Before(to)) && (p.To == nil || p.To.After(from)) {
			return true
		}
	}
	return false
}

// ahead counts the partitions that begin after now.
func (l *partitionLayout) ahead() int {
	n := 0
	for _, p := range l.parts {
		if p.From != nil && p.From.After(l.now) && !p.DetachPending {
			n++
		}
	}
	return n
}

// validWidth reports whether w is a week or divides a day into whole minutes. Weeks
// are aligned on Mondays: time.Truncate counts from January 1 of year 1, a Monday.
func validWidth(w time.Duration) error {
	if w == PartitionWeek {
		return nil
	}
	if w < time.Minute || w%time.Minute != 0 || (24*time.Hour)%w != 0 {
		return fmt.Errorf("partition width %s is not a week and does not divide a day into whole minutes", w)
	}
	return nil
}

// partitionName is the name of the partition of width w that begins at from (UTC):
// the prefix and from to the day, hour or minute, as w needs.
func partitionName(from time.Time, w time.Duration) string {
	layout := "200601021504"
	switch {
	case w%(24*time.Hour) == 0:
		layout = "20060102"
	case w%time.Hour == 0:
		layout = "2006010215"
	}
	return partitionPrefix + from.UTC().Format(layout)
}

// partitionStart parses a name partitionName made: its lower bound.
func partitionStart(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, partitionPrefix)
	if !ok {
		return time.Time{}, false
	}
	for _, layout := range []string{"20060102", "2006010215", "200601021504"} {
		if len(rest) == len(layout) {
			t, err := time.ParseInLocation(layout, rest, time.UTC)
			return t, err == nil
		}
	}
	return time.Time{}, false
}

// boundLiteral is t as a timestamptz literal for a partition bound.
func boundLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'"
}

// queryRow runs sql with args and scans its one row into dest: pgx.ErrNoRows when
// there is none.
func queryRow(ctx context.Context, db DBTX, dest []any, sql string, args ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// isPgCode reports whether err is a PostgreSQL error of one of codes.
func isPgCode(err error, codes ...string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	for _, c := range codes {
		if pgErr.Code == c {
			return true
		}
	}
	return false
}

// sqlScanLayout asks whether the database has the citus extension and whether the key
// table ($1, as to_regclass reads it) is partitioned.
const sqlScanLayout = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'),
	coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`

// scanLayout reports whether the database has citus and whether the key table is
// partitioned: what perKey needs.
func (s *Store) scanLayout(ctx context.Context, db DBTX) (citus, partitioned bool, err error) {
	if err := queryRow(ctx, db, []any{&citus, &partitioned}, sqlScanLayout, s.tableName()); err != nil {
		return false, false, fmt.Errorf("detect key table layout: %w", Classify(err))
	}
	return citus, partitioned, nil
}

// noPartition reports whether a partitioned key table refused a row because no
// partition holds its creation time: partitions were not created far enough ahead.
// Nothing was written, and the same request succeeds once the partition exists, so
// Classify makes it ErrUnavailable (retryable), not an invalid value.
func noPartition(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// ownTableRows begins the condition of the single-statement sweeps (ScanSingle), which
// match rows by ctid: the row must belong to the key table itself. On a plain table
// every row does; on a partitioned one every row belongs to a partition, so a Store
// that learnt the plain layout before the table was moved to the partitioned one
// (docs/PARTITIONS.md) matches nothing there, where a ctid alone could match another
// partition's row.
const ownTableRows = `tableoid = 'idemflow_keys'::regclass AND `

// lookupSQL is the look-up's text for the layout s has learnt: on a partitioned key
// table, the one that prunes (sqlLookupPartitioned); until the layout is known, and on
// a plain table, sqlLookup, which is correct on both.
func (s *Store) lookupSQL() string {
	if s.learnt.partitioned.Load() == 2 {
		return s.sql.lookupPartitioned
	}
	return s.sql.lookup
}
