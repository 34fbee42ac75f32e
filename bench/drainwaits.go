package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The drain's optional look inside the server (-drain-sample): what the sweepers'
// backends are doing, sampled from pg_stat_activity, and what the key table's
// statistics advanced by over the drain (updates, HOT updates, autovacuum and
// autoanalyze runs, dead tuples).

// sqlSweeperActivity is one sample of the sweepers' backends: state and wait event.
const sqlSweeperActivity = `
SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity
WHERE datname = $1 AND application_name = $2 AND backend_type = 'client backend'`

// drainSampler samples the sweepers' backends until finish.
type drainSampler struct {
	loop    *sampleLoop
	samples int
	seen    map[string]int // "state: wait type/event" -> backends seen so
}

// startDrainSampler samples every interval on e.sampler's connection; nil when every is 0.
func (e *env) startDrainSampler(ctx context.Context, every time.Duration) *drainSampler {
	if every <= 0 {
		return nil
	}
	s := &drainSampler{seen: map[string]int{}}
	s.loop = startSampleLoop(ctx, every, func(ctx context.Context) error { return s.sample(ctx, e) })
	return s
}

func (s *drainSampler) sample(ctx context.Context, e *env) error {
	rows, err := e.sampler.Query(ctx, sqlSweeperActivity, e.db.name, appSweeper)
	if err != nil {
		return err
	}
	defer rows.Close()
	s.samples++
	for rows.Next() {
		var state, typ, ev string
		if err := rows.Scan(&state, &typ, &ev); err != nil {
			return err
		}
		k := state
		if typ != "" {
			k += ": " + typ + "/" + ev
		}
		s.seen[k]++
	}
	return rows.Err()
}

// finish stops the sampler and logs what it saw, the most seen first.
func (s *drainSampler) finish() {
	if s == nil {
		return
	}
	if err := s.loop.end(); err != nil {
		logf("drain: sampling pg_stat_activity failed: %v", err)
		return
	}
	keys := make([]string, 0, len(s.seen))
	for k := range s.seen {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.seen[b] - s.seen[a] })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "; %s %.2f", k, float64(s.seen[k])/float64(s.samples))
	}
	logf("drain: sweeper backends per sample (%d samples)%s", s.samples, b.String())
}

// tableStats are the key table's cumulative statistics.
type tableStats struct {
	upd, hot, dead, vacuums, analyzes int64
}

// keyTableStats reads the key table's statistics (pg_stat_user_tables; backends
// report theirs at most once a second, so the figures are near, not exact).
func (e *env) keyTableStats(ctx context.Context) (tableStats, error) {
	var t tableStats
	err := e.check.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint,
			coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint, coalesce(sum(autoanalyze_count), 0)::bigint
		FROM pg_stat_user_tables WHERE relname LIKE 'idemflow_keys%'`).Scan(&t.upd, &t.hot, &t.dead, &t.vacuums, &t.analyzes)
	return t, err
}

// logTableStats logs what the key table's statistics advanced by from a to b.
func logTableStats(a, b tableStats, keys int) {
	n := float64(keys)
	logf("drain: key table per key: %.2f updates (%.2f HOT); autovacuums %d, autoanalyzes %d over the drain; dead tuples %d -> %d",
		float64(b.upd-a.upd)/n, float64(b.hot-a.hot)/n, b.vacuums-a.vacuums, b.analyzes-a.analyzes, a.dead, b.dead)
}
