package keytable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// errScanSingleOnPartitioned: a Store made with ScanSingle was used on a
	// partitioned key table, where ctid is unique only within a partition.
	errScanSingleOnPartitioned = errors.New("scan single matches rows by ctid, which a partitioned key table does not allow")
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
	// Contended counts partitions past retention that another process was removing
	// at the same time (its detach pending or done, the table dropped since, or this
	// step's statement cancelled in a deadlock with its DETACH … FINALIZE): left to
	// that process, or to the next step. Often non-zero means several sweepers'
	// removals overlap; none of them is lost.
	Contended int
	// Busy: another process held the maintenance lock; nothing was created.
	Busy bool
	// Stall, on Citus only (no concurrent detach there), is the longest plain detach
	// of the step: how long a live statement on the key table may have waited behind
	// it (bounded by a 200 ms lock timeout plus the detach itself; docs/PARTITIONS.md).
	Stall time.Duration
	// Removal is how long the removal of partitions past retention took (the checks,
	// detaches and drops of the step), and DropLock the longest any of the step's
	// transactions held a detached table's ACCESS EXCLUSIVE lock (the check for live
	// keys under that lock, the drop, and with the paced removal each index it sheds
	// first): the most a live statement planned before the detach could have waited
	// on it (docs/PARTITIONS.md).
	Removal, DropLock time.Duration
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
	table  string // the key table as the statements of sql.go name it
	// addr, once learnt, names a row's partition; texts are the per-key statements
	// addressed to partitions (textsN of them, about). See onPartition.
	addr   *atomic.Pointer[partAddress]
	texts  *sync.Map
	textsN *atomic.Int64
	// The claim that inserts without a look-up before (QueueKeyWrite with a claim not held), on this
	// layout: the lock, the check, then the insert (see queueClaimChecks).
	claimLock, claimAbsent, insertKey, insertFinished string
}

func newPartStatements(schema string) partStatements {
	q := func(sql string) string { return qualify(sql, schema) }
	return partStatements{schema: schema, table: qualify(keyTable, schema),
		addr: &atomic.Pointer[partAddress]{}, texts: &sync.Map{}, textsN: &atomic.Int64{},
		claimLock: q(sqlClaimLockChecked), claimAbsent: q(sqlPipeClaimAbsent),
		insertKey: q(sqlInsertKey + "\nRETURNING created_at"), insertFinished: q(sqlInsertFinished + "\nRETURNING created_at")}
}

// ident is a partition's name as the statements of sql.go would name it: qualified
// by the Store's schema option, or by none (the search_path's, as the key table).
func (p partStatements) ident(name string) string {
	if p.schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{p.schema, name}.Sanitize()
}

// partitionPrefix begins the name of every partition the Store creates; the rest is
// the lower bound in UTC (see partitionName).
const partitionPrefix = keyTable + "_p"

// layout reads the key table's layout from the catalog, on db (a transaction when the
// caller holds the maintenance lock).
func (s *Store) layout(ctx context.Context, db DBTX) (*partitionLayout, error) {
	l := &partitionLayout{}
	var citus bool
	err := queryRow(ctx, db, []any{&l.schema, &l.partitioned, &l.now, &citus}, sqlPartitionTable, s.tableName())
	if err == nil {
		s.learnt.citus.Store(map[bool]int32{false: 1, true: 2}[citus])
	}
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
	if err != nil {
		return nil, Classify(err)
	}
	// A partition another process detached between the two listings is in both: the
	// later listing holds, so that a removal handles (and counts) it once, as a
	// detached table.
	l.parts = slices.DeleteFunc(l.parts, func(p Partition) bool { return slices.Contains(l.orphans, p.Name) })
	return l, nil
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

// PartitionName is the name the Store gives the partition of width w that begins at
// from (partitionName), for the benchmark's hand-made partitions (testkit/retention).
func PartitionName(from time.Time, w time.Duration) string { return partitionName(from, w) }

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

// Addressing a row's partition by name (docs/PARTITIONS.md, "Addressing the row's
// partition"). On PostgreSQL 15 a statement on the partitioned table, planned once
// for every partition (pgx's cached statements get generic plans), locks every
// partition and sets up every one it does not prune as it starts: the cost grows with
// the partition count. A per-key statement knows its row's created_at, hence its
// partition (bounds in UTC, aligned to the width, names from the lower bound), so a
// Store that has learnt the layout sends it to that partition itself: one table, as
// on the plain layout. The replay path's look-up first probes the current partition
// the same way.

// partAddress is what a Store needs to name a row's partition, learnt from the
// catalog (CheckPartitions, EnsurePartitions).
type partAddress struct {
	width time.Duration
	// since: rows created before it are in a partition whose name is not derived
	// from its bound (a table moved to the layout, attached from MINVALUE): they are
	// addressed through the key table.
	since time.Time
	// skew is the database clock less this process's when the layout was read:
	// what the current partition is, by the database clock, give or take the round
	// trip (a wrong guess costs the look-up a second statement, nothing else).
	skew time.Duration
}

// address is how the partitions of l are named, or nil when it cannot tell (no
// partition with both bounds, or a width of another kind).
func (l *partitionLayout) address(local time.Time) *partAddress {
	w, err := l.width()
	if err != nil || validWidth(w) != nil {
		return nil
	}
	a := &partAddress{width: w, skew: l.now.Sub(local)}
	for _, p := range l.parts {
		regular := p.From != nil && p.To != nil && p.To.Sub(*p.From) == w &&
			p.From.Equal(p.From.Truncate(w)) && p.Name == partitionName(*p.From, w)
		switch {
		case regular:
		case p.To == nil:
			return nil // a partition up to MAXVALUE: nothing is named by its bound
		case p.To.After(a.since):
			a.since = *p.To
		}
	}
	return a
}

// learnAddress makes s address the partitions of l by name from now on; on Citus it
// keeps sending every statement to the key table (the layout there is not built:
// docs/PARTITIONS.md).
func (s *Store) learnAddress(ctx context.Context, db DBTX, l *partitionLayout, local time.Time) {
	if !l.partitioned {
		s.part.addr.Store(nil)
		return
	}
	citus, _, err := s.scanLayout(ctx, db)
	if err != nil || citus {
		return
	}
	s.part.addr.Store(l.address(local))
}

// partText is one statement's text addressed to one partition.
type partText struct{ sql, partition string }

// partTextsMax bounds the texts a Store keeps: one a statement and partition the
// process has written to. Past it they are built again (partitions come and go).
const partTextsMax = 512

// partitionOf is the name of the partition that holds a row created at createdAt, or
// "" when s does not address partitions by name or the row is older than the named
// ones.
func (s *Store) partitionOf(createdAt time.Time) string {
	a := s.part.addr.Load()
	if a == nil || createdAt.IsZero() || createdAt.Before(a.since) {
		return ""
	}
	return partitionName(createdAt.Truncate(a.width), a.width)
}

// onPartition is sql, a per-key statement of sql.go on the row created at createdAt,
// sent to the row's partition instead of the key table when s addresses partitions
// by name: the key table's name after its UPDATE (or FROM, for the look-up, or INSERT
// INTO, for the insert under a claim that read the transaction's start) is replaced
// by the partition's. Otherwise, or when createdAt is unknown (zero), sql.
// The statement matches what it matched before: the row is in that partition or in
// none (a row's partition is fixed by created_at, and every statement names the
// created_at it is addressed by). A partition dropped since makes it fail with 42P01,
// which Classify reports as ErrLeaseLost: the row is gone (for an insert, insertErr
// reports ErrUnavailable: nothing was written).
func (s *Store) onPartition(sql string, createdAt time.Time) string {
	name := s.partitionOf(createdAt)
	if name == "" {
		return sql
	}
	k := partText{sql, name}
	if t, ok := s.part.texts.Load(k); ok {
		return t.(string)
	}
	t := sql
	for _, at := range [...]struct{ verb, after string }{{"UPDATE ", "\n"}, {"FROM ", "\n"}, {"INSERT INTO ", " ("}} {
		if before := at.verb + s.part.table + at.after; strings.Count(sql, before) == 1 {
			t = strings.Replace(sql, before, at.verb+s.part.ident(name)+at.after, 1)
			break
		}
	}
	if t == sql {
		return sql // not a statement this knows how to address: the key table's
	}
	if s.part.textsN.Add(1) > partTextsMax {
		s.part.texts.Clear()
		s.part.textsN.Store(1)
	}
	s.part.texts.Store(k, t)
	return t
}

// outsidePartition reports whether a row inserted into a partition by name was
// refused by its bounds.
func outsidePartition(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "23514" && strings.Contains(pgErr.Message, "violates partition constraint")
}

// partitionGone reports whether a statement was sent to a partition that no longer
// exists (undefined_table naming one of the key table's partitions).
func partitionGone(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "42P01" && strings.Contains(pgErr.Message, `"`+partitionPrefix)
}

// currentPartitionLookup is the look-up sent to the partition that holds the
// database's now (as s estimates it) when db runs it outside a transaction, or "".
// Sent first by Lookup: a replay of a recent key then reads one table.
func (s *Store) currentPartitionLookup(db DBTX) string {
	a := s.part.addr.Load()
	if a == nil || !outsideTx(db) {
		return ""
	}
	t := s.onPartition(s.sql.lookupPartitioned, time.Now().Add(a.skew))
	if t == s.sql.lookupPartitioned {
		return ""
	}
	return t
}

// outsideTx reports whether a statement on db runs in a transaction of its own, so
// that one that fails (a partition just dropped) aborts nothing of the caller's.
func outsideTx(db DBTX) bool {
	switch c := db.(type) {
	case *pgxpool.Pool:
		return true
	case *pgxpool.Conn:
		return c.Conn().PgConn().TxStatus() == 'I'
	case *pgx.Conn:
		return c.PgConn().TxStatus() == 'I'
	}
	return false
}

// The claim that inserts a new key's row without a look-up before it under the lock
// (QueueKeyWrite with a claim not held: a first call phase's commit, a first
// answer stored alone) relies on the primary key on the plain layout: a row that
// exists makes the insert fail, whatever the snapshot. A partitioned key table has no
// such key, so there, and wherever the Store has not learnt that the table is plain,
// the claim is three statements in the one round trip: the claim
// lock, raising when another transaction holds it; then, in a statement of its own (a
// snapshot taken after the lock, see sqlClaimLock), the check that no partition holds
// the key, raising when one does; then the insert. The first returns two columns, the
// plain form's one: readClaimInsertAt tells the forms apart by that, so a Store that
// learns the layout between queueing and reading reads what it queued.

// sqlClaimLockChecked takes the claim lock, or raises 22012 when another transaction
// holds it.
var sqlClaimLockChecked = `SELECT 1/pg_try_advisory_xact_lock(` + claimLockID("1") + `)::int, now()`

// queueClaimChecks queues the claim lock and the check that no row exists unless s has
// learnt that its key table is plain, and reports whether it did: the insert that
// follows is then the plain insert returning created_at. Until the layout is learnt it
// takes this form, the strictest (invariant 13): it is correct on both layouts, where
// the plain form's single insert relies on a primary key that a partitioned table does
// not have across partitions, so that two concurrent claims would each insert a row.
func (s *Store) queueClaimChecks(b *pgx.Batch, c Claim) bool {
	if s.learnt.partitioned.Load() == 1 {
		return false
	}
	b.Queue(s.part.claimLock, claimHash(c.Scope, c.Key))
	b.Queue(s.part.claimAbsent, c.Scope, c.Key)
	return true
}

// readClaimInsertAt reads either form of the claim that inserts: the inserted row's
// created_at, pgx.ErrNoRows or ErrClaimBusy when the lock was held elsewhere,
// ErrClaimExists when a row exists, or the error of the statement that failed.
func readClaimInsertAt(br pgx.BatchResults) (time.Time, error) {
	var at time.Time
	rows, _ := br.Query()
	if !rows.Next() {
		rows.Close()
		if err := rows.Err(); isCode(err, codeDivisionByZero) {
			return at, fmt.Errorf("claim key: %w", ErrClaimBusy)
		} else if err != nil {
			return at, err
		}
		return at, pgx.ErrNoRows
	}
	if len(rows.RawValues()) != 2 { // the plain form: the insert's created_at
		err := rows.Scan(&at)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		return at, err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return at, err
	}
	if _, err := br.Exec(); isCode(err, codeDivisionByZero) {
		return at, fmt.Errorf("claim key: %w", ErrClaimExists)
	} else if err != nil {
		return at, err
	}
	return at, br.QueryRow().Scan(&at)
}
