package keytable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The expiries: finished, dead-lettered and parked keys deleted after their retention
// (their statements are in expire_sql.go).

// ExpireFinished deletes, in one short statement, up to limit finished keys that
// finished more than olderThan ago (by the database clock), oldest first, skipping
// rows locked by anyone else. It returns how many it deleted; fewer than limit means
// the backlog is (for now) cleared. Unfinished and dead-lettered keys are never
// deleted.
//
// On a partitioned key table it deletes only the finished keys of partitions past
// their removal (every row created more than olderThan ago: RemovePartitions' own
// test), which a partition's unfinished or dead-lettered key keeps attached. The
// others go with their partition, without a row's delete: deleting them here, as
// they finish, would leave the partitions nearly empty by the time they are
// dropped, and the layout's saving (no delete's WAL, no vacuum of the key table) would
// never come (docs/PARTITIONS.md, "Removing, never losing").
func (s *Store) ExpireFinished(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	return s.ExpireFinishedWaiting(ctx, db, olderThan, limit, 0)
}

// ExpireFinishedWaiting is ExpireFinished for a sweeper whose partition removal waits
// up to wait for its window (SweeperConfig.PartitionRemoval: a day): on a partitioned
// key table it deletes the finished keys of a partition only once the partition has
// been past its removal for wait too, so that a partition waiting for the window goes
// whole, as one without a window does. On a plain key table wait changes nothing.
func (s *Store) ExpireFinishedWaiting(ctx context.Context, db DBTX, olderThan time.Duration, limit int, wait time.Duration) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("expire finished keys: limit %d is not positive", limit)
	}
	ms := olderThan.Milliseconds()
	x := expiry{what: "finished", single: s.sql.expire, scan: s.sql.scanFinished, del: s.sql.expireFinishedKey}
	scanArgs := []any{ms, limit}
	w, err := s.partitionWidth(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("expire finished keys: %w", err)
	}
	if w > 0 {
		// A row created more than olderThan + w ago is in a partition whose upper
		// bound is more than olderThan ago, and every row of such a partition was.
		x.scan = s.sql.scanFinishedRemovable
		scanArgs = append(scanArgs, (olderThan + w + max(wait, 0)).Milliseconds())
	}
	return s.expire(ctx, db, x, ms, []any{ms, limit}, scanArgs)
}

// partitionWidth is the width of the key table's partitions, or 0 when the table is
// not partitioned (learnt once, as the scans learn it) or its partitions' width
// cannot be read.
func (s *Store) partitionWidth(ctx context.Context, db DBTX) (time.Duration, error) {
	if s.learnt.partitioned.Load() == 0 {
		_, partitioned, err := s.scanLayout(ctx, db)
		if err != nil {
			return 0, err
		}
		s.learnt.partitioned.Store(map[bool]int32{false: 1, true: 2}[partitioned])
	}
	if s.learnt.partitioned.Load() != 2 {
		return 0, nil
	}
	if a := s.part.addr.Load(); a != nil {
		return a.width, nil
	}
	l, err := s.layout(ctx, db) // on Citus, or before the Store addressed partitions
	if err != nil {
		return 0, err
	}
	if w, err := l.width(); err == nil {
		return w, nil
	}
	// Partitions not made by SetupPartitioned (named otherwise, no bounds to read a
	// width from): expired by finish, as the plain table.
	return 0, nil
}

// ExpireDead deletes, in one short statement, up to limit dead-lettered keys that were
// dead-lettered more than olderThan ago (by the database clock), oldest first,
// skipping rows locked by anyone else, and returns how many.
func (s *Store) ExpireDead(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("expire dead keys: limit %d is not positive", limit)
	}
	ms := olderThan.Milliseconds()
	x := expiry{what: "dead", single: s.admin.expireDead, scan: s.admin.scanDead, del: s.admin.expireDeadKey}
	return s.expire(ctx, db, x, ms, []any{ms, limit}, []any{ms, limit})
}

// ExpireParked deletes, in one short statement, up to limit keys of flows (the
// client-only ones) in progress without a live lease and claimed more than olderThan
// ago, and returns how many.
func (s *Store) ExpireParked(ctx context.Context, db DBTX, flows []string, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("expire parked keys: limit %d is not positive", limit)
	}
	if len(flows) == 0 {
		return 0, nil
	}
	ms := olderThan.Milliseconds()
	x := expiry{what: "parked", single: s.admin.expireParked, scan: s.admin.scanParked, del: s.admin.expireParkedKey}
	return s.expire(ctx, db, x, ms, []any{ms, limit, flows}, []any{flows, limit, ms})
}

// expiry is one kind of key that retention deletes: what (for messages), its single
// statement (ScanSingle) and its scan and per-key delete (ScanPerKey).
type expiry struct {
	what              string
	single, scan, del string
}

// expire deletes up to a batch of x's keys more than olderThan ms old, as s scans:
// single runs with singleArgs, scan with scanArgs. It returns how many it deleted.
func (s *Store) expire(ctx context.Context, db DBTX, x expiry, olderThan int64, singleArgs, scanArgs []any) (int64, error) {
	perKey, err := s.perKey(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("expire %s keys: %w", x.what, err)
	}
	var n int64
	if perKey {
		n, err = expireKeys(ctx, db, x.scan, x.del, olderThan, scanArgs...)
	} else {
		var tag pgconn.CommandTag
		tag, err = db.Exec(ctx, x.single, singleArgs...)
		n, err = tag.RowsAffected(), Classify(err)
	}
	if err != nil {
		return n, fmt.Errorf("expire %s keys: %w", x.what, err)
	}
	return n, nil
}

// expireKeys deletes the candidates of the scan sql (args) with the delete del (see
// deleteOfScope), one statement per scope, all in one round trip, and returns how
// many it deleted. del's arguments are a scope, its keys and olderThan in ms.
func expireKeys(ctx context.Context, db DBTX, scan, del string, olderThan int64, args ...any) (int64, error) {
	cands, err := scanKeys(ctx, db, scan, args...)
	if err != nil || len(cands) == 0 {
		return 0, err
	}
	var scopes []string
	keys := map[string][]string{}
	created := map[string][2]time.Time{} // the first and the last
	for _, c := range cands {
		span, ok := created[c.scope]
		if !ok {
			scopes = append(scopes, c.scope)
			span = [2]time.Time{c.created, c.created}
		}
		keys[c.scope] = append(keys[c.scope], c.key)
		if c.created.Before(span[0]) {
			span[0] = c.created
		}
		if c.created.After(span[1]) {
			span[1] = c.created
		}
		created[c.scope] = span
	}
	b := &pgx.Batch{}
	for _, scope := range scopes {
		b.Queue(del, scope, keys[scope], olderThan, created[scope][0], created[scope][1])
	}
	var n int64
	err = each(ctx, db, b, func(rows pgx.Rows) error {
		rows.Close()
		n += rows.CommandTag().RowsAffected()
		return rows.Err()
	})
	return n, err
}
