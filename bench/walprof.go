package main

import (
	"context"
	"fmt"
	"time"
)

// walRecord is one kind of WAL record, per request.
type walRecord struct {
	Kind  string  // resource manager/record type, e.g. Heap/UPDATE
	Count float64 // records per request
	Bytes float64 // record bytes per request, full-page images excluded
	FPI   float64 // full-page image bytes per request
}

// walProfile is what one variant writes to the WAL, by record type.
type walProfile struct {
	Variant  string
	N        int
	Records  []walRecord
	Total    float64 // record bytes per request
	TotalFPI float64
}

// walProfiles runs each variant alone at concurrency 1 for dur and breaks the WAL it
// wrote down by record type with pg_walinspect (PostgreSQL 15+, superuser). It returns
// nothing, with a note, where the extension cannot be created.
func (e *env) walProfiles(ctx context.Context, dur time.Duration) ([]walProfile, error) {
	if _, err := e.check.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		logf("no WAL profile: %v", err)
		return nil, nil
	}
	var out []walProfile
	for _, v := range e.variants {
		var start, end string
		if err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&start); err != nil {
			return nil, err
		}
		l := e.runLoad(ctx, v.fast, 1, dur, nil)
		if l.errs > 0 {
			return nil, fmt.Errorf("WAL profile of %s: %w", v.name, l.firstErr)
		}
		if err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end); err != nil {
			return nil, err
		}
		// pg_get_wal_stats reads only flushed WAL: a committed write flushes everything
		// inserted before it.
		if _, err := e.check.Exec(ctx, "UPDATE bench_flush SET one = one"); err != nil {
			return nil, err
		}
		p := walProfile{Variant: v.name, N: l.n}
		if start == end {
			logf("WAL profile: %-16s %5d requests  no WAL", v.name, p.N)
			out = append(out, p)
			continue
		}
		rows, err := e.check.Query(ctx, `
			SELECT "resource_manager/record_type", count, record_size, fpi_size
			FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true)
			WHERE count > 0
			ORDER BY combined_size DESC`, start, end)
		if err != nil {
			return nil, fmt.Errorf("WAL profile of %s: %w", v.name, err)
		}
		n := float64(l.n)
		for rows.Next() {
			var kind string
			var count, size, fpi int64
			if err := rows.Scan(&kind, &count, &size, &fpi); err != nil {
				rows.Close()
				return nil, err
			}
			r := walRecord{Kind: kind, Count: float64(count) / n, Bytes: float64(size) / n, FPI: float64(fpi) / n}
			p.Records = append(p.Records, r)
			p.Total += r.Bytes
			p.TotalFPI += r.FPI
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		logf("WAL profile: %-16s %5d requests  %6.0f record bytes + %6.0f FPI bytes per request", v.name, p.N, p.Total, p.TotalFPI)
		out = append(out, p)
	}
	return out, nil
}
