package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The growth experiment runs on each configuration of -growth-configs (issue 40 item
// 5): "default" is the bench's own server (PostgreSQL's defaults: 128 MB of shared
// buffers, whatever the machine); "production" is a throwaway server of its own
// configured as a team would run PostgreSQL on this machine (productionSettings).
// The growth targets are judged on the production-like configuration, the default one
// reported beside it.

// growthConfig is one server configuration the growth experiment runs on.
type growthConfig struct {
	name     string
	settings []string // beyond pgtest's; nil: the bench's own server
}

// growthConfigsOf parses -growth-configs.
func growthConfigsOf(list string, memKB int64) ([]growthConfig, error) {
	var out []growthConfig
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		switch n {
		case "default":
			out = append(out, growthConfig{name: n})
		case "production":
			out = append(out, growthConfig{name: n, settings: productionSettings(memKB)})
		default:
			return nil, fmt.Errorf("-growth-configs: %q: want production or default", n)
		}
	}
	return out, nil
}

// productionSettings size PostgreSQL to a machine with memKB of memory, as the usual
// guidance does for a dedicated database server: a quarter of the memory for shared
// buffers, three quarters as the planner's estimate of the cache, a checkpoint every
// 15 minutes at most with room for the WAL between, and random reads priced as on an
// SSD. Durability stays as the rounds have it (fsync and synchronous_commit on).
func productionSettings(memKB int64) []string {
	mb := max(memKB/1024, 1024)
	return []string{
		"shared_buffers=" + strconv.FormatInt(mb/4, 10) + "MB",
		"effective_cache_size=" + strconv.FormatInt(mb*3/4, 10) + "MB",
		"maintenance_work_mem=" + strconv.FormatInt(min(mb/16, 2048), 10) + "MB",
		"work_mem=16MB",
		"wal_buffers=16MB",
		"max_wal_size=8GB",
		"checkpoint_timeout=15min",
		"checkpoint_completion_target=0.9",
		"random_page_cost=1.1",
		"effective_io_concurrency=200",
	}
}

// memTotalKB is the machine's memory (/proc/meminfo), 0 when unknown.
func memTotalKB() int64 {
	var n int64
	if _, err := fmt.Sscanf(firstField("/proc/meminfo", "MemTotal"), "%d kB", &n); err != nil {
		return 0
	}
	return n
}

// growthServer is the server a configuration runs on: the bench's own for "default",
// else a throwaway one started with the configuration's settings, which stop ends.
func (e *env) growthServer(ctx context.Context, c growthConfig) (url string, stop func(), err error) {
	if c.settings == nil {
		return e.db.serverURL, func() {}, nil
	}
	if e.srv == nil {
		return "", nil, fmt.Errorf("growth: the %s configuration needs a throwaway server of its own (the run was given -db or $DATABASE_URL)", c.name)
	}
	srv, err := pgtest.StartWith(ctx, &pgtest.StartOptions{Settings: c.settings})
	if err != nil {
		return "", nil, fmt.Errorf("growth: start the %s server: %w", c.name, err)
	}
	return srv.URL, func() {
		if e.o.keep {
			return
		}
		if err := srv.Stop(); err != nil {
			logf("growth: stop the %s server: %v", c.name, err)
		}
	}, nil
}

// recentWindow is how old a key a replay of recent keys may pick: retries come
// seconds or minutes after their original.
const recentWindow = time.Minute

// recentRing holds the keys a side finished, in the order they finished, up to its
// capacity; pick draws uniformly among those finished within recentWindow.
type recentRing struct {
	mu    sync.Mutex
	keys  [][2]string
	at    []time.Time
	start int // the oldest entry, once full
}

func newRecentRing(size int) *recentRing {
	return &recentRing{keys: make([][2]string, 0, size), at: make([]time.Time, 0, size)}
}

func (r *recentRing) add(scope, key string) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) < cap(r.keys) {
		r.keys, r.at = append(r.keys, [2]string{scope, key}), append(r.at, now)
		return
	}
	r.keys[r.start], r.at[r.start] = [2]string{scope, key}, now
	r.start = (r.start + 1) % len(r.keys)
}

// pick draws one of the keys finished within recentWindow; false when there is none.
func (r *recentRing) pick(rng *rand.Rand) ([2]string, bool) {
	cutoff := time.Now().Add(-recentWindow)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.keys)
	phys := func(i int) int { return (r.start + i) % n }
	first := sort.Search(n, func(i int) bool { return !r.at[phys(i)].Before(cutoff) })
	if first == n {
		return [2]string{}, false
	}
	return r.keys[phys(first+rng.IntN(n-first))], true
}

// oldSample is about how many bulk-loaded keys the grown side's old replays draw from.
const oldSample = 50000

// sampleOld reads about oldSample keys of the grown side's bulk-loaded rows, spread
// over the whole table (TABLESAMPLE SYSTEM reads whole pages picked at random, all of
// each), for replays of keys finished long ago.
func (s *growthDB) sampleOld(ctx context.Context, rows int) error {
	pct := min(100, 100*float64(oldSample)/float64(max(rows, 1)))
	r, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT scope, idempotency_key FROM idemflow_keys TABLESAMPLE SYSTEM (%g)
		WHERE idempotency_key NOT LIKE 'template-%%'`, pct))
	if err != nil {
		return fmt.Errorf("growth: sample old keys: %w", err)
	}
	var keys [][2]string
	for r.Next() {
		var scope, key string
		if err := r.Scan(&scope, &key); err != nil {
			r.Close()
			return err
		}
		keys = append(keys, [2]string{scope, key})
	}
	r.Close()
	if err := r.Err(); err != nil {
		return fmt.Errorf("growth: sample old keys: %w", err)
	}
	s.old = &keyRing{keys: keys}
	if len(s.old.keys) == 0 {
		return fmt.Errorf("%w: growth: no bulk-loaded key found to replay", errInvariant)
	}
	return nil
}
