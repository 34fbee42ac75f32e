package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// envStatsEvery is the environment variable that makes serve and worker print, every
// that long (a Go duration such as "5s"), one line of process statistics on stderr:
// "charges-stats " followed by a JSON processStats. Unset or empty: no lines. The
// reliability suite's soak samples its server and worker processes this way.
const envStatsEvery = "CHARGES_STATS_EVERY"

// processStats is one line of CHARGES_STATS_EVERY output.
type processStats struct {
	At         time.Time `json:"at"`
	HeapLive   uint64    `json:"heap_live"`  // bytes live after the last GC (/gc/heap/live:bytes)
	Goroutines uint64    `json:"goroutines"` // /sched/goroutines:goroutines
	PoolTotal  int32     `json:"pool_total"` // the pool's open connections
	PoolInUse  int32     `json:"pool_in_use"`
	PoolIdle   int32     `json:"pool_idle"`
}

// startStats starts the CHARGES_STATS_EVERY printer on pool, if the variable is set; it
// stops when ctx ends. A value that is not a positive duration is an error.
func startStats(ctx context.Context, pool *pgxpool.Pool, w io.Writer) error {
	raw := os.Getenv(envStatsEvery)
	if raw == "" {
		return nil
	}
	every, err := time.ParseDuration(raw)
	if err != nil || every <= 0 {
		return fmt.Errorf("%s=%q: want a positive duration such as 5s", envStatsEvery, raw)
	}
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			metrics.Read(samples)
			st := pool.Stat()
			line := processStats{At: time.Now().UTC(), PoolTotal: st.TotalConns(), PoolInUse: st.AcquiredConns(), PoolIdle: st.IdleConns()}
			if samples[0].Value.Kind() == metrics.KindUint64 {
				line.HeapLive = samples[0].Value.Uint64()
			}
			if samples[1].Value.Kind() == metrics.KindUint64 {
				line.Goroutines = samples[1].Value.Uint64()
			}
			raw, err := json.Marshal(line)
			if err != nil {
				continue
			}
			_, _ = w.Write(append(append([]byte("charges-stats "), raw...), '\n')) // one write: no interleaving with the log
		}
	}()
	return nil
}
