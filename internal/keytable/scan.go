package keytable

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scan is how a Store's sweeps and expiries find and change keys across scopes.
type Scan string

const (
	// ScanAuto is ScanPerKey when the database has the citus extension, ScanSingle
	// otherwise, asked once per Store on its first sweep or expiry.
	ScanAuto Scan = ""
	// ScanSingle takes over or deletes a batch of keys in one statement that locks its
	// candidates with FOR UPDATE SKIP LOCKED and matches them by ctid: the cheapest
	// form on plain PostgreSQL, refused by Citus on a distributed table.
	ScanSingle Scan = "single"
	// ScanPerKey reads a batch of candidates across scopes without locking anything,
	// then takes over or deletes each by its primary key in a statement of its own (a
	// single-shard statement on Citus) that skips a row locked by anyone else and
	// re-checks every guard. The statements of one batch go in one round trip.
	ScanPerKey Scan = "per_key"
)

// Options configure a Store made by NewWith.
type Options struct {
	// Schema names the key table's schema, quoted, whatever the connection's
	// search_path (ValidateSchema says which names it refuses). Empty: the current schema.
	Schema string
	// Scan is how sweeps and expiries work. Defaults to ScanAuto.
	Scan Scan
	// SealedBodies makes sweeps take keys whose request body is sealed (phase data
	// format PhaseDataSealed) as well: set it when the caller can open them. Without
	// it such keys are left for a caller that can.
	SealedBodies bool
}

// NewWith returns a Store with opts. It fails on a schema ValidateSchema refuses and on
// an unknown Scan.
func NewWith(opts Options) (*Store, error) {
	switch opts.Scan {
	case ScanAuto, ScanSingle, ScanPerKey:
	default:
		return nil, fmt.Errorf("unknown scan %q (want %q, %q or empty)", opts.Scan, ScanSingle, ScanPerKey)
	}
	s, err := newInSchema(opts.Schema)
	if err != nil {
		return nil, err
	}
	s.scan = opts.Scan
	if opts.SealedBodies {
		s.withSealedBodies()
	}
	return s, nil
}

// scanState is what a Store with ScanAuto learnt: 0 not asked yet, else a scan mode.
type scanState struct {
	perKey atomic.Int32
	// partitioned: 0 not asked yet, 1 no, 2 yes (MaintainPartitions, partition.go).
	partitioned atomic.Int32
	// citus: whether the database has the citus extension, as partitioned (SendExplicit).
	citus atomic.Int32
}

// ScanPerKey's statements are in sql_scan.go.

// perKey reports whether s scans per key, asking db once for ScanAuto and ScanSingle:
// a partitioned key table is always scanned per key, and refuses ScanSingle (ctid is
// unique only within a partition; see scanLayout in partition.go).
func (s *Store) perKey(ctx context.Context, db DBTX) (bool, error) {
	switch s.learnt.perKey.Load() {
	case 1:
		return false, nil
	case 2:
		return true, nil
	}
	if s.scan == ScanPerKey {
		return true, nil
	}
	citus, partitioned, err := s.scanLayout(ctx, db)
	switch {
	case err != nil:
		return false, err
	case partitioned && s.scan == ScanSingle:
		return false, errScanSingleOnPartitioned
	}
	s.learnt.partitioned.Store(map[bool]int32{false: 1, true: 2}[partitioned])
	s.learnt.citus.Store(map[bool]int32{false: 1, true: 2}[citus])
	perKey := (citus && s.scan == ScanAuto) || partitioned
	s.learnt.perKey.Store(map[bool]int32{false: 1, true: 2}[perKey])
	return perKey, nil
}

// candidate is a key a scan found: its scope, key, lock version and created_at.
type candidate struct {
	scope, key string
	version    int64
	created    time.Time
}

// scanKeys runs the scan sql with args and returns its candidates.
func scanKeys(ctx context.Context, db DBTX, sql string, args ...any) ([]candidate, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, Classify(err)
	}
	var out []candidate
	var c candidate
	_, err = pgx.ForEachRow(rows, []any{&c.scope, &c.key, &c.version, &c.created}, func() error {
		out = append(out, c)
		return nil
	})
	return out, Classify(err)
}

// batcher sends a batch in one round trip; a pool, a connection and a transaction can.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// each runs the statements of b, in one round trip when db can, else one by one, and
// hands each one's rows to read, in order. It stops at the first error, translated.
func each(ctx context.Context, db DBTX, b *pgx.Batch, read func(pgx.Rows) error) error {
	bt, ok := db.(batcher)
	if !ok {
		for _, q := range b.QueuedQueries {
			rows, err := db.Query(ctx, q.SQL, q.Arguments...)
			if err == nil {
				err = read(rows)
			}
			if err != nil {
				return Classify(err)
			}
		}
		return nil
	}
	br := bt.SendBatch(ctx, b)
	defer br.Close()
	for range b.QueuedQueries {
		rows, err := br.Query()
		if err == nil {
			err = read(rows)
		}
		if err != nil {
			return Classify(err)
		}
	}
	return Classify(br.Close())
}
