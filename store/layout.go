package store

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Widths a partitioned key table may have: a week, or any width that divides a day
// into whole minutes; these are the ones documented.
const (
	// PartitionWeek: partitions from Monday 00:00 UTC to the next, for retentions of
	// two weeks or more (fewer partitions: each statement's cost grows with how many
	// the table has).
	PartitionWeek = keytable.PartitionWeek
	// PartitionDay: partitions from 00:00 UTC to the next, the usual width.
	PartitionDay  = keytable.PartitionDay
	PartitionHour = keytable.PartitionHour
	// PartitionMinute is for tests that cross partition boundaries.
	PartitionMinute = keytable.PartitionMinute
)

// Errors of the layout's maintenance. The errors of the database itself (unavailable,
// refused, a conflict) are workflow's: workflow.ErrUnavailable, ErrRefused,
// ErrConflict match what these methods return, wrapped.
var (
	// ErrNotPartitioned: the key table is not partitioned (EnsurePartitions,
	// RemovePartitions, Partitions, CheckPartitions), or SetupPartitioned was asked
	// for a key table that is missing.
	ErrNotPartitioned = keytable.ErrNotPartitioned
	// ErrNotEmpty: SetupPartitioned found rows in the key table. A table with rows is
	// moved by the procedure in docs/PARTITIONS.md.
	ErrNotEmpty = keytable.ErrNotEmpty
	// ErrLiveKeysInDetached: a partition detached for removal held an unfinished or
	// dead-lettered key after all; it was attached back, not dropped.
	ErrLiveKeysInDetached = keytable.ErrLiveKeysInDetached
)

// DBTX runs statements; *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PartitionDB runs maintenance: statements outside a transaction (a concurrent detach
// cannot run in one) and transactions. *pgxpool.Pool and *pgx.Conn satisfy it.
type PartitionDB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Partition is one partition of a partitioned key table: its Name; its bounds From
// and To (To excluded; nil for MINVALUE and MAXVALUE: a table moved to the layout is
// attached from MINVALUE); DetachPending when a concurrent detach of it began and did
// not finish.
type Partition = keytable.Partition

// PartitionReport is what one maintenance step did: Ahead, how many partitions begin
// after the database clock's now; Created and Removed, partitions created (or
// attached) and dropped; Kept, partitions past retention kept because they hold an
// unfinished or dead-lettered key; Contended, partitions past retention left to
// another process that was removing them at the same time; Busy, another process
// held the maintenance lock and nothing was created; Stall, on Citus only, the
// longest plain detach of the step (how long a live statement may have waited behind
// it); Want, how many partitions the default ahead calls for. Its Low method reports
// fewer than half of Want ahead: a row whose creation time has no partition cannot be
// inserted (its claim fails with a retryable error), so that is worth a warning.
type PartitionReport = keytable.PartitionReport

// Store lays out and maintains idemflow's key table. The engine runs its own
// statements; a Store is what a deployment uses to move the table to the partitioned
// layout and, if no sweeper runs, to keep its partitions. The zero Store is not
// usable.
type Store struct{ t *keytable.Store }

// New returns a Store on the key table of the current schema (the first schema of the
// connection's search_path that exists).
func New() *Store { return &Store{t: keytable.New()} }

// NewInSchema returns a Store on the key table in schema, quoted, whatever the
// connection's search_path (workflow.Config.Schema). An empty schema is New's current
// schema. It fails on a name PostgreSQL cannot hold: longer than 63 bytes or with a
// NUL byte.
func NewInSchema(schema string) (*Store, error) {
	t, err := keytable.NewWith(keytable.Options{Schema: schema})
	if err != nil {
		return nil, err
	}
	return &Store{t: t}, nil
}

// SetupPartitioned turns the key table, freshly migrated and empty, into the
// partitioned layout (docs/PARTITIONS.md) with partitions of width w (PartitionDay,
// PartitionWeek, PartitionHour, or any width that divides a day into whole minutes),
// and creates partitions from the current one to ahead from now (0: a week, or ten
// partitions for widths under an hour). It runs in one transaction: the table keeps
// its columns, defaults, state checks and indexes; its primary key becomes (scope,
// idempotency_key, created_at). A table already partitioned is left as it is, and
// only its partitions are ensured. It fails with ErrNotEmpty when the table has rows,
// ErrNotPartitioned when it does not exist.
func (s *Store) SetupPartitioned(ctx context.Context, db PartitionDB, w, ahead time.Duration) error {
	return s.t.SetupPartitioned(ctx, db, w, ahead)
}

// EnsurePartitions creates the partitions missing from the current one to ahead from
// now by the database clock (0: a week, or ten partitions for widths under an hour),
// each by creating a table and then attaching it, which no live statement waits on.
// It runs in one short transaction under the key table's maintenance lock, taken
// without waiting: when another process holds it, nothing is created and the report
// says Busy. It returns ErrNotPartitioned when the key table is not partitioned.
func (s *Store) EnsurePartitions(ctx context.Context, db PartitionDB, ahead time.Duration) (PartitionReport, error) {
	return s.t.EnsurePartitions(ctx, db, ahead)
}

// RemovePartitions removes the partitions whose every row was created more than
// retention ago (by the database clock) and that hold no unfinished and no
// dead-lettered key: it detaches each concurrently, checks the detached table once
// more, and drops it; no live statement waits on either. A partition that still holds
// such a key is kept and counted in the report's Kept. A detached table found to hold
// one after all is attached back, never dropped, and the error is
// ErrLiveKeysInDetached. It returns ErrNotPartitioned when the key table is not
// partitioned, and an error for a retention that is not positive.
func (s *Store) RemovePartitions(ctx context.Context, db PartitionDB, retention time.Duration) (PartitionReport, error) {
	return s.t.RemovePartitions(ctx, db, retention)
}

// Partitions lists the key table's partitions, oldest first. It returns
// ErrNotPartitioned when the key table is not partitioned.
func (s *Store) Partitions(ctx context.Context, db DBTX) ([]Partition, error) {
	return s.t.Partitions(ctx, db)
}

// CheckPartitions reads the key table's layout without changing anything: how many
// partitions exist ahead of now and how many the default ahead calls for (the
// report's Ahead and Want; Low says when a warning is due). On a plain key table it
// returns ErrNotPartitioned.
func (s *Store) CheckPartitions(ctx context.Context, db DBTX) (PartitionReport, error) {
	return s.t.CheckPartitions(ctx, db)
}
