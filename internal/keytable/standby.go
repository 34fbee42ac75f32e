package keytable

import (
	"context"
	"fmt"
)

// The statements of the standby wait (workflow.Config.StandbyWait), kept here with
// the others. None touches the key table.
const (
	// sqlWALTarget is the server's WAL insert position. Read after a COMMIT was
	// acknowledged, on any connection to the same server, it is at or past the end
	// of that commit's record whatever synchronous_commit the commit ran under: the
	// record is inserted before the COMMIT is answered (only its flush is skipped
	// with synchronous_commit off), and the insert position is one counter for the
	// whole server that only grows. The write position (pg_current_wal_lsn) is not:
	// an asynchronous commit's record may not have been written yet.
	// The second column says whether this session commits asynchronously: then the
	// engine's commits most likely did too, and the wait flushes at once rather than
	// giving the WAL writer time first.
	sqlWALTarget = `SELECT pg_current_wal_insert_lsn()::text, current_setting('synchronous_commit') = 'off'`
	// sqlStandbyState is whether a standby that can be promoted has flushed the WAL up
	// to $1, whether this server has flushed it (a standby is sent only flushed WAL),
	// and whether the role can read the standbys' positions at all (without
	// pg_read_all_stats, which pg_monitor includes, every column of
	// pg_stat_replication but pid reads as NULL). A standby counts when its walsender
	// streams, physically, to a server that replays: not a logical walsender (it is
	// connected to a database, which a physical standby's walreceiver never is, and it
	// holds a logical slot), not pg_receivewal or pg_basebackup (they replay nothing:
	// replay_lsn is NULL), and, when $2 names standbys, one whose application_name is
	// among them.
	sqlStandbyState = `SELECT coalesce(bool_or(r.flush_lsn >= $1::pg_lsn), false),
	pg_current_wal_flush_lsn() >= $1::pg_lsn,
	pg_has_role('pg_read_all_stats', 'USAGE')
FROM pg_stat_replication r
WHERE r.state = 'streaming'
	AND r.replay_lsn IS NOT NULL
	AND (coalesce(cardinality($2::text[]), 0) = 0 OR r.application_name = ANY ($2::text[]))
	AND EXISTS (SELECT FROM pg_stat_get_activity(r.pid) a WHERE coalesce(a.datid, 0) = 0)
	AND NOT EXISTS (SELECT FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')`
	// sqlFlushWAL makes the server flush its WAL up to a new commit's record, and so
	// past every record inserted before it. A commit is flushed before it is answered
	// (under synchronous_commit local, which waits for no standby: the standby wait
	// polls under its own bound) only if its transaction has an xid and wrote WAL;
	// a transactional logical decoding message (prefix "idemflow", empty, which
	// logical decoding passes on only to consumers that ask for messages) is the
	// smallest such write that touches no table. PUBLIC may call it.
	sqlFlushWAL = `BEGIN; SET LOCAL synchronous_commit TO local; SELECT pg_logical_emit_message(true, 'idemflow', ''); COMMIT`
)

// StandbyState is what the standby wait learns from one read of the primary.
type StandbyState struct {
	// Flushed: a standby that counts has flushed the WAL up to the target.
	Flushed bool
	// LocalFlushed: the primary itself has flushed the WAL up to the target.
	LocalFlushed bool
	// CanRead: the role can read the standbys' positions (pg_monitor).
	CanRead bool
}

// WALTarget returns the WAL position the standby wait waits for: the server's insert
// position, which covers every commit acknowledged before the call (see
// sqlWALTarget), as text (an LSN); and whether this session's synchronous_commit is
// off.
func (s *Store) WALTarget(ctx context.Context, db DBTX) (lsn string, async bool, err error) {
	rows, err := db.Query(ctx, sqlWALTarget)
	if err == nil {
		for rows.Next() {
			err = rows.Scan(&lsn, &async)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return "", false, fmt.Errorf("read WAL position: %w", Classify(err))
	}
	return lsn, async, nil
}

// ReadStandbyState reads whether a standby that counts (any physical streaming
// standby, or one of names when names is not empty) has flushed the WAL up to lsn.
func (s *Store) ReadStandbyState(ctx context.Context, db DBTX, lsn string, names []string) (StandbyState, error) {
	var st StandbyState
	if names == nil {
		names = []string{}
	}
	rows, err := db.Query(ctx, sqlStandbyState, lsn, names)
	if err == nil {
		for rows.Next() {
			err = rows.Scan(&st.Flushed, &st.LocalFlushed, &st.CanRead)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return StandbyState{}, fmt.Errorf("read standby position: %w", Classify(err))
	}
	return st, nil
}

// FlushWAL makes the server flush its WAL past every record inserted so far, with a
// commit of its own (an xid, a logical decoding message, a commit record, one flush).
func (s *Store) FlushWAL(ctx context.Context, db DBTX) error {
	if _, err := db.Exec(ctx, sqlFlushWAL); err != nil {
		return fmt.Errorf("flush WAL: %w", Classify(err))
	}
	return nil
}
