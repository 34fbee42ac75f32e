package keytable

import (
	"context"
	"fmt"
)

// The statements of the standby wait (workflow.Config.StandbyWait), kept here with
// the others. Neither touches the key table.
const (
	// sqlWALPosition is the end of the WAL written so far: past every commit this
	// session has been answered.
	sqlWALPosition = `SELECT pg_current_wal_lsn()::text`
	// sqlStandbyFlushed is whether a streaming standby has flushed the WAL up to $1.
	// Reading the positions in pg_stat_replication needs the pg_monitor role (or a
	// superuser); without it they read as NULL and the wait never ends.
	sqlStandbyFlushed = `SELECT coalesce(bool_or(flush_lsn >= $1::pg_lsn), false) FROM pg_stat_replication WHERE state = 'streaming'`
)

// WALPosition returns the end of the WAL written so far, as text (an LSN).
func (s *Store) WALPosition(ctx context.Context, db DBTX) (string, error) {
	var lsn string
	rows, err := db.Query(ctx, sqlWALPosition)
	if err == nil {
		for rows.Next() {
			err = rows.Scan(&lsn)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return "", fmt.Errorf("read WAL position: %w", Classify(err))
	}
	return lsn, nil
}

// StandbyFlushed reports whether a streaming standby has flushed the WAL up to lsn.
func (s *Store) StandbyFlushed(ctx context.Context, db DBTX, lsn string) (bool, error) {
	var ok bool
	rows, err := db.Query(ctx, sqlStandbyFlushed, lsn)
	if err == nil {
		for rows.Next() {
			err = rows.Scan(&ok)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return false, fmt.Errorf("read standby position: %w", Classify(err))
	}
	return ok, nil
}
