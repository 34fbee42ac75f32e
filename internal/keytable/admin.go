package keytable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/vocab"
)

// Operators' reads and actions: lists, one key in full, counts, and the release and
// purge of one key. Their SQL, with bulk.go's and erase.go's, is in sql_operator.go:
// nothing on a request's path sends it.

// Statuses a list can ask for, besides StatusFinished and StatusDead.
const (
	// StatusInProgress is every unfinished key that is not dead-lettered.
	StatusInProgress = "in_progress"
	// statusStuck is a key in progress whose lease expired or was released and that is
	// due: what a sweeper would take now (grace aside).
	statusStuck = "stuck"
)

// adminStatements are the texts of the operators' statements and of the expiry of
// unfinished keys (retention.go), built once by New or NewWith, qualified like
// statements (see qualify).
type adminStatements struct {
	list           map[string][2]string // by status: the first page, a later page
	show, counts   string
	gauges         string
	outcomes       string
	release, purge string
	// bulk.go's.
	bulkScan, bulkRedrive, bulkRelease, cancel, cancelFenced string
	// erase.go's.
	eraseBatch, eraseCount   string
	expireDead, expireParked string
	// ScanPerKey's (scan.go; their text is in sql_scan.go).
	scanDead, expireDeadKey, scanParked, expireParkedKey string
}

func newAdminStatements(schema string) adminStatements {
	a := adminStatements{
		list: map[string][2]string{}, show: sqlShow, counts: sqlCounts, gauges: sqlGauges, outcomes: sqlOutcomes,
		release: sqlOperatorRelease, purge: sqlPurge,
		bulkScan: sqlBulkScan, bulkRedrive: sqlBulkRedrive, bulkRelease: sqlBulkRelease, cancel: sqlCancel, cancelFenced: sqlCancelFenced,
		eraseBatch: sqlEraseBatch, eraseCount: sqlEraseCount,
		expireDead: sqlExpireDead, expireParked: sqlExpireParked,
		scanDead: sqlScanDead, expireDeadKey: sqlExpireDeadKey, scanParked: sqlScanParked, expireParkedKey: sqlExpireParkedKey,
	}
	for status, s := range listStatus {
		first, later := sqlList(s.where, s.order)
		a.list[status] = [2]string{first, later}
	}
	// Every text above, qualified; TestStatementsInSchema fails on one left out.
	q := func(sql string) string { return qualify(sql, schema) }
	for status, texts := range a.list {
		a.list[status] = [2]string{q(texts[0]), q(texts[1])}
	}
	a.show, a.counts, a.gauges, a.outcomes = q(a.show), q(a.counts), q(a.gauges), q(a.outcomes)
	a.release, a.purge = q(a.release), q(a.purge)
	a.bulkScan, a.bulkRedrive, a.bulkRelease, a.cancel = q(a.bulkScan), q(a.bulkRedrive), q(a.bulkRelease), q(a.cancel)
	a.cancelFenced = q(a.cancelFenced)
	a.eraseBatch, a.eraseCount = q(a.eraseBatch), q(a.eraseCount)
	a.expireDead, a.expireParked = q(a.expireDead), q(a.expireParked)
	a.scanDead, a.expireDeadKey = q(a.scanDead), q(a.expireDeadKey)
	a.scanParked, a.expireParkedKey = q(a.scanParked), q(a.expireParkedKey)
	return a
}

// ListKeys selects the keys List returns.
type ListKeys struct {
	// Status is "" for every key, or StatusInProgress, "stuck" (statusStuck), StatusDead or
	// StatusFinished. Others are refused.
	Status string
	// Flow and Scope, when not empty, keep only keys of that flow and scope.
	Flow, Scope string
	// OlderThan keeps only keys claimed at least that long ago (database clock).
	OlderThan time.Duration
	// Limit is the most keys returned. Required, positive.
	Limit int
	// After is the cursor of the last key of the previous page, or nil for the first.
	After *Cursor
}

// Cursor is a position in a list: the ordering time of a key (see KeySummary.Order)
// and its scope and key.
type Cursor struct {
	At         time.Time
	Scope, Key string
}

// KeySummary is a key as a list shows it.
type KeySummary struct {
	Scope, Key, ID, Flow string
	// Status is in_progress, stuck, dead or finished.
	Status        string
	RecoveryPoint string
	Attempts      int
	LastError     *string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	FinishedAt    *time.Time
	// Order is the time the list is ordered by (due time, claim or finish, by status).
	Order time.Time
}

// KeyDetail is one key in full.
type KeyDetail struct {
	KeySummary
	Method, Route   string
	RequestBody     []byte
	PhaseDataBytes  int
	LockVersion     int64
	LeaseLeftMillis int64
	NextAttemptAt   time.Time
	ResponseStatus  *int
	Origin          *string
	// History is the history column, a JSON array.
	History []byte
	// ResponseHeaders (a JSON object) and ResponseBody are the stored response's;
	// nil while unfinished.
	ResponseHeaders, ResponseBody []byte
	// PhaseDataFormat is the phase data's format version as stored (FormatMember, "1"
	// when absent): "2" (PhaseDataSealed) says that RequestBody is sealed.
	PhaseDataFormat string
}

// List returns up to q.Limit keys matching q, in the order of their status's index,
// after q.After. It locks nothing.
func (s *Store) List(ctx context.Context, db DBTX, q ListKeys) ([]KeySummary, error) {
	texts, ok := s.admin.list[q.Status]
	if !ok {
		return nil, fmt.Errorf("list keys: %w: %q", vocab.ErrUnknownStatus, q.Status)
	}
	if q.Limit <= 0 {
		return nil, fmt.Errorf("list keys: limit %d is not positive", q.Limit)
	}
	args := []any{q.Flow, q.Scope, max(q.OlderThan, 0).Milliseconds(), q.Limit}
	text := texts[0]
	if q.After != nil {
		text = texts[1]
		args = append(args, q.After.At, q.After.Scope, q.After.Key)
	}
	rows, err := db.Query(ctx, text, args...)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", Classify(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeySummary, error) {
		var k KeySummary
		err := r.Scan(summaryDest(&k, &k.Order)...)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", Classify(err))
	}
	return out, nil
}

func summaryDest(k *KeySummary, more ...any) []any {
	return append([]any{&k.Scope, &k.Key, &k.ID, &k.Flow, &k.Status, &k.RecoveryPoint, &k.Attempts,
		&k.LastError, &k.CreatedAt, &k.UpdatedAt, &k.FinishedAt}, more...)
}

// Show returns the key in full, or ErrNotFound.
func (s *Store) Show(ctx context.Context, db DBTX, scope, key string) (*KeyDetail, error) {
	rows, err := db.Query(ctx, s.admin.show, scope, key)
	if err != nil {
		return nil, fmt.Errorf("show key: %w", Classify(err))
	}
	d, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (*KeyDetail, error) {
		var d KeyDetail
		err := r.Scan(summaryDest(&d.KeySummary, &d.Method, &d.Route, &d.RequestBody, &d.PhaseDataBytes,
			&d.LockVersion, &d.LeaseLeftMillis, &d.NextAttemptAt, &d.ResponseStatus, &d.Origin, &d.History,
			&d.ResponseHeaders, &d.ResponseBody, &d.PhaseDataFormat)...)
		return &d, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("show key: %w", ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("show key: %w", Classify(err))
	}
	return d, nil
}

// Count is how many keys of a flow have a status: of every key (Counts: in_progress,
// stuck, dead, finished; a stuck key is not counted as in_progress), or of the keys
// that ended in one status (finished or dead) in the bucket of time that starts at
// Start (Outcomes).
type Count struct {
	Flow, Status string
	Start        time.Time // zero for Counts
	Keys         int64
}

// Counts counts every key by flow and status. It reads the whole table.
func (s *Store) Counts(ctx context.Context, db DBTX) ([]Count, error) {
	rows, err := db.Query(ctx, s.admin.counts)
	if err != nil {
		return nil, fmt.Errorf("count keys: %w", Classify(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Count, error) {
		var c Count
		err := r.Scan(&c.Flow, &c.Status, &c.Keys)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count keys: %w", Classify(err))
	}
	return out, nil
}

// Gauge is how many unfinished keys a flow has: in progress (stuck ones included),
// stuck, and dead-lettered; and how long its longest-waiting stuck key has been due.
type Gauge struct {
	Flow                    string
	InProgress, Stuck, Dead int64
	// OldestDue is how long ago, by the database clock, the stuck key that has waited
	// longest became due (its next attempt time or its lease's end, the later); 0
	// when none is stuck.
	OldestDue time.Duration
}

// Gauges counts unfinished keys by flow, in one statement that reads only the partial
// indexes of keys in progress and dead-lettered keys (and their rows): its cost grows
// with the unfinished keys, never with the finished ones.
func (s *Store) Gauges(ctx context.Context, db DBTX) ([]Gauge, error) {
	rows, err := db.Query(ctx, s.admin.gauges)
	if err != nil {
		return nil, fmt.Errorf("gauge keys: %w", Classify(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Gauge, error) {
		var g Gauge
		var ms *int64 // NULL when none is stuck
		err := r.Scan(&g.Flow, &g.InProgress, &g.Stuck, &g.Dead, &ms)
		if ms != nil {
			g.OldestDue = time.Duration(*ms) * time.Millisecond
		}
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("gauge keys: %w", Classify(err))
	}
	return out, nil
}

// Outcomes counts the keys that finished or were dead-lettered in the last window (by
// the database clock), by flow and by bucket of that width, buckets aligned on the Unix
// epoch; status is "" for both, or StatusFinished or StatusDead for one. Finished keys
// are read from their partial index over the window only; dead-lettered keys from
// theirs, which is ordered by creation, so that arm reads every dead key (at most
// sweeper.Config.DeadRetention's worth) and keeps those that died in the window. Its
// cost follows the keys that ended in the window plus the dead ones, never the table.
func (s *Store) Outcomes(ctx context.Context, db DBTX, window, bucket time.Duration, status string) ([]Count, error) {
	rows, err := db.Query(ctx, s.admin.outcomes, window.Milliseconds(), bucket.Milliseconds(), status)
	if err != nil {
		return nil, fmt.Errorf("count outcomes: %w", Classify(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Count, error) {
		var o Count
		err := r.Scan(&o.Flow, &o.Status, &o.Start, &o.Keys)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("count outcomes: %w", Classify(err))
	}
	return out, nil
}

// ReleaseKey takes the lease of a key in progress away from whoever holds it, live or
// not: the lock version is bumped, so that the holder, should it still run, can commit
// nothing more; the lease is cleared and the key is due at once. An operator's entry
// is added to its history (keep entries kept; 0: none). It returns the new lock
// version, or ErrNotFound when no key in progress (scope, key) exists.
func (s *Store) ReleaseKey(ctx context.Context, db DBTX, scope, key string, keep int) (int64, error) {
	rows, err := db.Query(ctx, s.admin.release, scope, key, max(keep, 0))
	if err != nil {
		return 0, fmt.Errorf("release key: %w", Classify(err))
	}
	v, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("release key: %w", ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("release key: %w", Classify(err))
	}
	return v, nil
}

// Purge deletes a finished key. It returns ErrNotFound when no finished key (scope,
// key) exists.
func (s *Store) Purge(ctx context.Context, db DBTX, scope, key string) error {
	tag, err := db.Exec(ctx, s.admin.purge, scope, key)
	if err != nil {
		return fmt.Errorf("purge key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("purge key: %w", ErrNotFound)
	}
	return nil
}
