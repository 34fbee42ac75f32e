package reliability

import (
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// soak is one soak run.
type soak struct {
	t     testing.TB
	env   *env
	cfg   soakConfig
	load  *soakLoad
	start time.Time

	mu      sync.Mutex
	procs   map[string]*soakProc
	windows []killWindow
	files   map[string]*soakFile
	// mail is the workers' mail service (-mail-url), in this process: the worker's
	// own fake mailbox remembers every key it was sent, which would grow the worker's
	// heap by itself.
	mail *httptest.Server
	// mailMu guards mailKeys: each Idempotency-Key mailed, and how often.
	mailMu   sync.Mutex
	mailKeys map[string]int
}

// soakFile is one CSV file the soak appends to as it goes, so that a run stopped
// early still leaves its samples.
type soakFile struct {
	f *os.File
	w *csv.Writer
}

func newSoak(t testing.TB, env *env, cfg soakConfig) *soak {
	s := &soak{t: t, env: env, cfg: cfg, procs: map[string]*soakProc{}, files: map[string]*soakFile{}, mailKeys: map[string]int{}}
	s.load = newSoakLoad(s)
	s.mail = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/mail" || r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, "POST /v1/mail with an Idempotency-Key", http.StatusBadRequest)
			return
		}
		s.mailMu.Lock()
		s.mailKeys[r.Header.Get("Idempotency-Key")]++
		s.mailMu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(s.mail.Close)
	return s
}

// mailsSent is how many mails the workers sent, repeats included.
func (s *soak) mailsSent() int64 {
	distinct, repeats := s.mailedKeys()
	return distinct + repeats
}

// mailedKeys is how many distinct keys were mailed, and how many mails repeated one.
func (s *soak) mailedKeys() (distinct, repeats int64) {
	s.mailMu.Lock()
	defer s.mailMu.Unlock()
	for _, n := range s.mailKeys {
		distinct++
		repeats += int64(n - 1)
	}
	return distinct, repeats
}

func (s *soak) samplesPath() string   { return filepath.Join(s.cfg.out, "samples.csv") }
func (s *soak) latenciesPath() string { return filepath.Join(s.cfg.out, "latencies.csv") }
func (s *soak) killsPath() string     { return filepath.Join(s.cfg.out, "kills.csv") }

// appendRow appends a row to the CSV file at path, writing header first if the file
// is new. Callers hold s.mu.
func (s *soak) appendRow(path string, header, row []string) error {
	f := s.files[path]
	if f == nil {
		fh, err := os.Create(path)
		if err != nil {
			return err
		}
		f = &soakFile{f: fh, w: csv.NewWriter(fh)}
		s.files[path] = f
		if err := f.w.Write(header); err != nil {
			return err
		}
	}
	if err := f.w.Write(row); err != nil {
		return err
	}
	f.w.Flush()
	return f.w.Error()
}

// writeFiles makes sure each file exists and closes them.
func (s *soak) writeFiles() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files[s.killsPath()] == nil {
		if err := os.WriteFile(s.killsPath(), []byte("from_s,to_s\n"), 0o644); err != nil {
			return err
		}
	}
	for _, f := range s.files {
		f.w.Flush()
		if err := f.f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// measureCapacity measures the fresh throughput of the servers at concurrency 8.
func (s *soak) measureCapacity() float64 { return s.load.capacity(s.cfg.capacityFor) }

// run offers the mix at rate for the configured duration while sampling and killing,
// and returns once every key has its final answer.
func (s *soak) run(rate float64) {
	s.start = time.Now()
	s.load.start = s.start
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { s.sampler(stop) })
	wg.Go(func() { s.killer(stop) })
	s.load.offer(rate, s.cfg.duration)
	close(stop)
	wg.Wait()
}

// sampler takes a sample every sampleEvery until stop closes, and a last one then.
func (s *soak) sampler(stop <-chan struct{}) {
	tick := time.NewTicker(s.cfg.sampleEvery)
	defer tick.Stop()
	prev := time.Duration(0)
	for {
		select {
		case <-stop:
			s.sample(prev)
			return
		case <-tick.C:
		}
		prev = s.sample(prev)
	}
}

// sampleCols are samples.csv's columns after t_s and kill: per process slot, then the
// key table, then the timed requests of the interval, then the load's counters.
func sampleCols() []string {
	cols := []string{"t_s", "kill"}
	for _, slot := range soakSlots {
		cols = append(cols, slot+"_heap_live", slot+"_goroutines", slot+"_pool_total", slot+"_pool_in_use")
	}
	cols = append(cols, "key_rows", "table_bytes", "index_bytes", "live_tup", "dead_tup", "autovacuum_count", "autoanalyze_count")
	for _, k := range latNames {
		cols = append(cols, k+"_n", k+"_p50_ms", k+"_p99_ms")
	}
	return append(cols, "submitted", "shed", "outbox_backlog")
}

// sample writes one row of samples.csv and the interval's timed requests to
// latencies.csv; since is the end of the previous interval. It returns this one's end.
func (s *soak) sample(since time.Duration) time.Duration {
	now := time.Since(s.start)
	row := []float64{now.Seconds(), 0}
	s.mu.Lock()
	for _, w := range s.windows {
		if w.from < now && w.to > since {
			row[1] = 1
		}
	}
	for _, slot := range soakSlots {
		st, ok := s.procs[slot].latest(3 * time.Second)
		if !ok {
			row = append(row, math.NaN(), math.NaN(), math.NaN(), math.NaN())
			continue
		}
		row = append(row, float64(st.HeapLive), float64(st.Goroutines), float64(st.PoolTotal), float64(st.PoolInUse))
	}
	s.mu.Unlock()
	row = append(row, s.tableStats()...)
	lats := s.load.takeLats()
	for kind := range latNames {
		var ms []float64
		for _, l := range lats {
			if l.kind == kind {
				ms = append(ms, float64(l.took.Microseconds())/1000)
			}
		}
		row = append(row, float64(len(ms)), quantile(ms, 0.5), quantile(ms, 0.99))
	}
	row = append(row, float64(s.load.submitted.Load()), float64(s.load.shed.Load()), s.outboxBacklog())
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.appendRow(s.samplesPath(), sampleCols(), formatRow(row)); err != nil {
		s.load.fail(fmt.Errorf("samples: %w", err))
	}
	for _, l := range lats {
		r := []string{strconv.FormatInt(l.at.Milliseconds(), 10), latNames[l.kind], strconv.FormatInt(l.took.Microseconds(), 10)}
		if err := s.appendRow(s.latenciesPath(), []string{"t_ms", "kind", "us"}, r); err != nil {
			s.load.fail(fmt.Errorf("latencies: %w", err))
			break
		}
	}
	return now
}

// tableStats are the key table's row count, table and index bytes, live and dead
// tuples and autovacuum and autoanalyze runs (NaN if the query failed). On the
// partitioned layout each is the sum over its partitions (the parent has no storage of
// its own; pg_partition_tree lists no row for a plain table, which is its own only
// leaf).
func (s *soak) tableStats() []float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rows, table, index, live, dead, vac, ana int64
	err := s.env.db.Pool.QueryRow(ctx, sqlKeyTableStats).Scan(&rows, &table, &index, &live, &dead, &vac, &ana)
	if err != nil {
		nan := math.NaN()
		return []float64{nan, nan, nan, nan, nan, nan, nan}
	}
	return []float64{float64(rows), float64(table), float64(index), float64(live), float64(dead), float64(vac), float64(ana)}
}

// sqlKeyTableStats reads tableStats. A partition dropped between the listing and the
// size functions counts nothing (they return NULL for a relation that is gone).
const sqlKeyTableStats = `SELECT (SELECT count(*) FROM idemflow_keys),
	coalesce(sum(pg_table_size(p.relid)), 0)::bigint, coalesce(sum(pg_indexes_size(p.relid)), 0)::bigint,
	coalesce(sum(st.n_live_tup), 0)::bigint, coalesce(sum(st.n_dead_tup), 0)::bigint,
	coalesce(sum(st.autovacuum_count), 0)::bigint, coalesce(sum(st.autoanalyze_count), 0)::bigint
FROM (SELECT relid FROM pg_partition_tree('idemflow_keys') WHERE isleaf
	UNION SELECT oid FROM pg_class WHERE oid = 'idemflow_keys'::regclass AND relkind = 'r') p
LEFT JOIN pg_stat_user_tables st ON st.relid = p.relid`

func formatRow(row []float64) []string {
	out := make([]string, len(row))
	for i, v := range row {
		switch {
		case math.IsNaN(v):
			out[i] = ""
		case v == math.Trunc(v) && math.Abs(v) < 1e15:
			out[i] = strconv.FormatInt(int64(v), 10)
		default:
			out[i] = strconv.FormatFloat(v, 'f', 3, 64)
		}
	}
	return out
}

// quantile is the q-quantile of xs (nearest rank), NaN for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
