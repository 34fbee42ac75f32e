package reliability

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// procMax is the largest of each statistic a server process printed
// (CHARGES_STATS_EVERY) in a window of time.
type procMax struct {
	heapLive   uint64
	goroutines uint64
	poolInUse  int32
	samples    int
}

// serverStats reads the CHARGES_STATS_EVERY lines of s's output and returns the
// largest values of the lines printed between from and to.
func serverStats(s *server, from, to time.Time) procMax {
	var m procMax
	for _, line := range strings.Split(s.output(), "\n") {
		raw, ok := strings.CutPrefix(line, "charges-stats ")
		if !ok {
			continue
		}
		var st procStats
		if json.Unmarshal([]byte(raw), &st) != nil || st.At.Before(from) || !st.At.Before(to) {
			continue
		}
		m.samples++
		m.heapLive = max(m.heapLive, st.HeapLive)
		m.goroutines = max(m.goroutines, st.Goroutines)
		m.poolInUse = max(m.poolInUse, st.PoolInUse)
	}
	return m
}

// metricsURL is the Prometheus endpoint a server started with -telemetry prometheus
// printed, or "".
func metricsURL(s *server) string {
	for _, line := range strings.Split(s.output(), "\n") {
		if u, ok := strings.CutPrefix(line, "metrics: "); ok {
			return strings.TrimSpace(u)
		}
	}
	return ""
}

// shedBuckets are the cumulative counts of the engine-side durations of the attempts
// turned away (outcome shed), by upper bound in seconds, summed over the servers.
type shedBuckets map[float64]float64

// scrapeShed reads the idemflow.attempt.duration histogram of outcome shed of each
// server.
func scrapeShed(servers []*server) shedBuckets {
	b := shedBuckets{}
	for _, s := range servers {
		u := metricsURL(s)
		if u == "" {
			continue
		}
		resp, err := http.Get(u)
		if err != nil {
			continue
		}
		addShed(b, resp.Body)
		resp.Body.Close()
	}
	return b
}

func addShed(b shedBuckets, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "idemflow_attempt_duration_seconds_bucket{") || !strings.Contains(line, `idemflow_outcome="shed"`) {
			continue
		}
		_, rest, _ := strings.Cut(line, `le="`)
		le, rest, _ := strings.Cut(rest, `"`)
		_, val, _ := strings.Cut(rest, "} ")
		bound, err1 := strconv.ParseFloat(le, 64) // +Inf parses as infinity
		n, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err1 == nil && err2 == nil {
			b[bound] += n
		}
	}
}

// within is how many attempts of the phase were turned away within bound seconds,
// and how many in all, from the buckets at its end and at its start.
func (b shedBuckets) within(start shedBuckets, bound float64) (in, all float64) {
	inf := b[posInf] - start[posInf]
	return b[bound] - start[bound], inf
}

var posInf, _ = strconv.ParseFloat("+Inf", 64)

// spread is the phase's refusals by engine-side duration: how many ended within
// each bucket bound, as "<=10ms:N <=25ms:N ...".
func (b shedBuckets) spread(start shedBuckets) string {
	bounds := slices.Sorted(maps.Keys(b))
	var out []string
	prev := 0.0
	for _, le := range bounds {
		n := b[le] - start[le]
		if n > prev {
			out = append(out, fmt.Sprintf("<=%gs:%.0f", le, n-prev))
		}
		prev = n
	}
	return strings.Join(out, " ")
}

// sessionMax is the largest count, in one sample of pg_stat_activity, of the
// servers' sessions idle in a transaction for over 100ms (a connection held while
// the attempt does something else, such as wait for another), of sessions waiting on
// a lock (another attempt's), and of sessions in a transaction.
type sessionMax struct {
	idleInTx, lockWait, inTx int
	queries                  []string // what the sessions idle in a transaction or waiting on a lock last ran
}

// sessionSampler samples the sessions of application app every 100ms until stop.
type sessionSampler struct {
	mu      sync.Mutex
	samples []sessionSample
}

type sessionSample struct {
	at                       time.Time
	idleInTx, lockWait, inTx int
	queries                  []string
}

func (s *sessionSampler) run(ctx context.Context, pool *pgxpool.Pool, app string) {
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		var x sessionSample
		err := pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%' AND now() - state_change > interval '100 ms'),
			       count(*) FILTER (WHERE wait_event_type = 'Lock'),
			       count(*) FILTER (WHERE xact_start IS NOT NULL),
			       coalesce(array_agg(state || coalesce(' waiting on ' || wait_event, '') || ': ' || left(regexp_replace(query, '\s+', ' ', 'g'), 80))
			         FILTER (WHERE (state LIKE 'idle in transaction%' AND now() - state_change > interval '100 ms') OR wait_event_type = 'Lock'), '{}')
			FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&x.idleInTx, &x.lockWait, &x.inTx, &x.queries)
		if err != nil {
			continue
		}
		x.at = time.Now()
		s.mu.Lock()
		s.samples = append(s.samples, x)
		s.mu.Unlock()
	}
}

func (s *sessionSampler) max(from, to time.Time) sessionMax {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m sessionMax
	for _, x := range s.samples {
		if x.at.Before(from) || !x.at.Before(to) {
			continue
		}
		m.idleInTx, m.lockWait, m.inTx = max(m.idleInTx, x.idleInTx), max(m.lockWait, x.lockWait), max(m.inTx, x.inTx)
		for _, q := range x.queries {
			if !slices.Contains(m.queries, q) {
				m.queries = append(m.queries, q)
			}
		}
	}
	return m
}
