package keytable

import (
	"context"
	"fmt"
	"time"
)

// The end of keys that never finish: dead-lettered keys, and parked keys whose client
// never came back. Like the expiry of finished keys (sqlExpireFinished), each
// statement deletes a short batch of rows it locked with SKIP LOCKED, oldest first,
// and re-checks its guard on them.

// sqlExpireDead deletes up to $2 dead-lettered keys dead-lettered (last changed) more
// than $1 ms ago. A re-drive makes a key in progress again, and so safe from it.
const sqlExpireDead = `DELETE FROM idemflow_keys
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'dead'
			AND updated_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY created_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'dead'
	AND updated_at < statement_timestamp() - $1::bigint * interval '1 millisecond'`

// sqlExpireParked deletes up to $2 keys of the client-only flows $3 that are in
// progress with no live lease and were claimed more than $1 ms ago: parked keys whose
// client never finished them.
const sqlExpireParked = `DELETE FROM idemflow_keys
WHERE ` + ownTableRows + `ctid = ANY(ARRAY(
		SELECT ctid
		FROM idemflow_keys
		WHERE status = 'in_progress'
			AND flow = ANY($3::text[])
			AND (locked_until IS NULL OR locked_until <= statement_timestamp())
			AND created_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
		ORDER BY next_attempt_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	AND status = 'in_progress'
	AND (locked_until IS NULL OR locked_until <= statement_timestamp())
	AND created_at < statement_timestamp() - $1::bigint * interval '1 millisecond'`

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
