package keytable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TakeDue selects the keys a sweeper takes over.
type TakeDue struct {
	// Limit is the most keys taken by one statement. Required, positive.
	Limit int
	// Grace is how old a key must be (since its claim) before it is taken.
	Grace time.Duration
	// Lease is the lease set on each key taken.
	Lease time.Duration
	// Flows limits the keys taken to these flows: the ones the caller can handle.
	Flows []string
	// Points, when not nil, limits them further to these recovery points of each flow
	// ("started" and its phases): a key at a point its flow does not list here was
	// written by another build of the flow, and is left for one that knows it. Keys
	// whose phase data is in a newer format (see FormatMember) are never taken.
	Points map[string][]string
	// History is how many history entries a key keeps, for the abandoned attempt a
	// takeover records (see Store.Takeover). 0: history is off.
	History int
	// From is where in the order of due keys the statement starts reading, as a
	// fraction in [0, 1) of the time from the oldest unfinished key's due time to now;
	// it then wraps around to the oldest, so every due key is within its reach. 0: the
	// oldest due first. Sweepers that take at once from different points lock
	// different keys rather than all reach for the oldest. The per-key scan
	// (ScanPerKey: partitioned tables, Citus) lists its candidates from it too.
	From float64
}

// Park is what Park writes on a key row that only its client can finish.
type Park struct {
	// LastError says why the key waits for its client; it is cut to 2000 bytes.
	LastError string
	// RetryIn is how long sweepers leave the key alone. A client's retry may take it
	// over at any time.
	RetryIn time.Duration
	// History is the sweep's entry.
	History History
}

// DeadLetter is what DeadLetter writes on a key row it gives up on.
type DeadLetter struct {
	// RecoveryPoint and Data are kept on the row, so a re-drive resumes where the key
	// stopped.
	RecoveryPoint string
	Data          []byte
	// LastError is recorded on the row, cut to 2000 bytes.
	LastError string
	// Stored is the recovery point the caller last knew the row to hold; the statement
	// matches only while it still does, as Release.
	Stored string
	// History is the attempt's entry.
	History History
}

// TakeDue takes over, in one short statement (in a transaction of its own under
// sqlTakeDuePlan's planner settings, so that its cost grows with q.Limit and not with
// the number of keys due; with ScanPerKey: a scan and a statement per key, in two round
// trips), up to q.Limit unfinished keys whose lease expired or
// was released, that are due (next_attempt_at) and older than q.Grace, of a flow in
// q.Flows, in due order from q.From (0: the oldest due first), wrapping around. Each is returned with its lock version and attempt count
// bumped and a fresh lease. Keys locked by another transaction are skipped, not waited
// for, so concurrent sweepers take disjoint sets and live traffic is never blocked. It
// returns an empty slice when nothing is due.
func (s *Store) TakeDue(ctx context.Context, db DBTX, q TakeDue) ([]*Row, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("take due keys: limit %d is not positive", q.Limit)
	}
	if !(q.From >= 0 && q.From < 1) {
		return nil, fmt.Errorf("take due keys: start point %v is outside [0, 1)", q.From)
	}
	if len(q.Flows) == 0 {
		return []*Row{}, nil
	}
	perKey, err := s.perKey(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("take due keys: %w", err)
	}
	if perKey {
		return s.takeDuePerKey(ctx, db, q)
	}
	args := []any{q.Limit, q.Grace.Milliseconds(), q.Lease.Milliseconds(), q.Flows, max(q.History, 0), pointKeys(q.Points), q.From}
	out := []*Row{}
	switch db := db.(type) {
	case *pgxpool.Pool: // a transaction of its own in one round trip
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(sqlTakeDuePlan)
		b.Queue(s.sql.takeDue, args...).Query(func(rows pgx.Rows) error { return pgxscan.ScanAll(&out, rows) })
		b.Queue("COMMIT")
		err = db.SendBatch(ctx, b).Close()
	case beginner: // a connection, or a transaction (then a savepoint)
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTakeDuePlan); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, s.sql.takeDue, args...)
			if err == nil {
				err = pgxscan.ScanAll(&out, rows)
			}
			return err
		})
	default:
		err = errors.New("the takeover needs a pool, a connection or a transaction")
	}
	if err != nil {
		return nil, fmt.Errorf("take due keys: %w", Classify(err))
	}
	return out, nil
}

// beginner is a DBTX that can open a transaction (a pool, a connection, a
// transaction: a savepoint).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// scanSpread is how many candidates a per-key sweep scans for each key it may take.
// Sweepers that scan at once from nearby start points read the same candidates; one
// that finds the first ones taken by another goes on to the next, so that they share
// the work rather than race for the same keys and come back empty.
const scanSpread = 4

// takeDuePerKey is TakeDue for ScanPerKey: a scan for up to scanSpread×q.Limit
// candidates, in due order from q.From, then takeover statements for the first q.Limit of
// them in one round trip, and again with the next ones for those that were not taken
// (another sweeper took them, a request holds them, or they finished since the scan),
// until q.Limit are taken or the candidates run out.
func (s *Store) takeDuePerKey(ctx context.Context, db DBTX, q TakeDue) ([]*Row, error) {
	points := pointKeys(q.Points)
	cands, err := scanKeys(ctx, db, s.sql.scanDue, scanSpread*q.Limit, q.Grace.Milliseconds(), q.Flows, points, q.From)
	if err != nil {
		return nil, fmt.Errorf("take due keys: scan: %w", err)
	}
	out := []*Row{}
	for len(cands) > 0 && len(out) < q.Limit {
		n := min(q.Limit-len(out), len(cands))
		b := &pgx.Batch{}
		for _, c := range cands[:n] {
			b.Queue(s.sql.takeKey, c.scope, c.key, c.version, q.Lease.Milliseconds(), max(q.History, 0), points, c.created)
		}
		cands = cands[n:]
		err = each(ctx, db, b, func(rows pgx.Rows) error {
			row, err := scanOne(rows, "take key", errTakeNone)
			switch {
			case errors.Is(err, ErrNotTaken):
				return nil
			case err == nil:
				out = append(out, row)
			}
			return err
		})
		if err != nil {
			// What was taken before the error, if it stayed taken, is left to its lease.
			return nil, fmt.Errorf("take due keys: %w", err)
		}
	}
	return out, nil
}

// GiveBack gives back a key taken over with TakeDue but never run: the lease is
// cleared, the takeover's attempt uncounted, and the key stays due for any sweeper. It
// returns ErrLeaseLost if the fence does not match or the key is not leased.
func (s *Store) GiveBack(ctx context.Context, db DBTX, f Fence) error {
	tag, err := db.Exec(ctx, s.onPartition(s.sql.giveBack, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, f.CreatedAt)
	if err != nil {
		return fmt.Errorf("give back key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("give back key: %w", ErrLeaseLost)
	}
	return nil
}

// Park parks a key taken over with TakeDue that only its client can finish (a
// client-only flow's): the lease is cleared, the takeover's attempt uncounted,
// p.LastError recorded, and the key is not due again for a sweeper until p.RetryIn has
// passed. A client's retry may take it over at any time. It returns ErrLeaseLost if
// the fence does not match or the key is not leased.
func (s *Store) Park(ctx context.Context, db DBTX, f Fence, p Park) error {
	e, keep := p.History.args()
	tag, err := db.Exec(ctx, s.onPartition(s.sql.park, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, truncate(p.LastError, 2000), p.RetryIn.Milliseconds(), e, keep, f.CreatedAt)
	if err != nil {
		return fmt.Errorf("park key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("park key: %w", ErrLeaseLost)
	}
	return nil
}

// DeadLetter marks a key dead with d.LastError: it is no longer run by anyone until
// Redrive, and keeps d's recovery point and phase data. The lease is cleared. It
// returns ErrLeaseLost if the fence does not match (the key was taken over, finished
// or deleted since).
func (s *Store) DeadLetter(ctx context.Context, db DBTX, f Fence, d DeadLetter) error {
	e, keep := d.History.args()
	tag, err := db.Exec(ctx, s.onPartition(s.sql.deadLetter, f.CreatedAt), f.Scope, f.Key, f.ID, f.LockVersion, d.RecoveryPoint, json.RawMessage(d.Data), truncate(d.LastError, 2000), d.Stored, e, keep, f.CreatedAt)
	if err != nil {
		return fmt.Errorf("dead-letter key: %w", Classify(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("dead-letter key: %w", ErrLeaseLost)
	}
	return nil
}

// Redrive puts a dead-lettered key back in progress: released, attempts reset to 0,
// due now, lock version bumped, h appended to its history. It returns ErrNotFound when
// no dead-lettered key (scope, key) exists, whether the key is missing or in another
// state.
func (s *Store) Redrive(ctx context.Context, db DBTX, scope, key string, h History) (*Row, error) {
	e, keep := h.args()
	rows, err := db.Query(ctx, s.sql.redrive, scope, key, e, keep)
	if err != nil {
		return nil, fmt.Errorf("re-drive key: %w", Classify(err))
	}
	return scanOne(rows, "re-drive key", errRedriveNone)
}
