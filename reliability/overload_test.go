package reliability

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// overloadFull reports whether the overload experiment runs in full (IDEMFLOW_OVERLOAD=1
// or the nightly tier): both setups, measured phases of 10s (15s for the one after
// the overload) and the pass lines of issue 23 checked and reported. The quick tier
// runs the default setup for a second a phase and asserts only what does not depend
// on time.
func overloadFull() bool { return os.Getenv("IDEMFLOW_OVERLOAD") == "1" || nightly() }

// overloadSetup is one configuration of the servers under test.
type overloadSetup struct {
	name  string
	flags []string
}

// overloadSetups: the engine's defaults, and the settings docs/OPERATIONS.md gives
// for shedding early (2 attempts in flight per connection of pgx's default pool of 4,
// AdmitWait well under the clients' 2s timeout).
var overloadSetups = []overloadSetup{
	{"default", nil},
	{"tuned", []string{"-max-in-flight", "8", "-admit-wait", "250ms"}},
}

// overloadPhase is one phase of a setup's run: offered load as a multiple of the
// measured capacity.
type overloadPhase struct {
	name     string
	mult     float64
	run      *overloadRun
	from, to time.Time
	shed     [2]shedBuckets // the servers' shed histograms at from and at to
}

// TestOverload offers load to two charges servers on one schema, once with the
// engine's default settings and once with the tuned ones (overloadSetups): half of
// the measured capacity, then 2x and 5x capacity, then half again, from clients that
// give up after 2s and from patient clients (idemclient: retries with backoff and
// Retry-After). It samples each server's live heap, goroutines and pool
// (CHARGES_STATS_EVERY), the engine-side duration of each refusal (-telemetry
// prometheus) and the servers' sessions in pg_stat_activity. Every tier asserts only
// what does not depend on the machine's speed: every answer is final or a refusal (503
// or 409) with Retry-After, no key has two charges or more payments than key rows, and
// once every operation ended each server makes new charges again (counted,
// not timed). With IDEMFLOW_OVERLOAD=1 (or the nightly tier) the table of
// docs/RELIABILITY.md is logged with issue 23's timing targets reported as met or not
// met: a 2-core machine whose load generator shares the cores cannot hold timing
// lines, so they belong to the report, not to the test's verdict (issue 37).
func TestOverload(t *testing.T) {
	t.Parallel()
	env := newEnv(t, pgtest.New(t))
	setups := overloadSetups[:1]
	if overloadFull() {
		setups = overloadSetups
	}
	for _, su := range setups {
		runOverload(t, env, su)
	}
	var twice int
	require.NoError(t, env.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM (SELECT 1 FROM charges GROUP BY account_id, idempotency_key HAVING count(*) > 1) d`).Scan(&twice))
	require.Zero(t, twice, "keys with two charges")
	var rows int
	require.NoError(t, env.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_keys`).Scan(&rows))
	payments, _, _, _ := env.provider.snapshot()
	require.LessOrEqual(t, len(payments), rows, "more payments than key rows")
}

// withAppName is the database URL u with application_name set.
func withAppName(t *testing.T, u, app string) string {
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	q := parsed.Query()
	q.Set("application_name", app)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// runOverload runs the phases on two fresh servers of setup su and logs its table.
func runOverload(t *testing.T, env *env, su overloadSetup) {
	app := env.appName + "_" + su.name
	flags := append([]string{"-database-url", withAppName(t, env.db.URL, app), "-telemetry", "prometheus", "-metrics-addr", "127.0.0.1:0"}, su.flags...)
	servers := []*server{env.startServerWith(t, flags, "CHARGES_STATS_EVERY=100ms"), env.startServerWith(t, flags, "CHARGES_STATS_EVERY=100ms")}
	defer func() {
		for _, s := range servers {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
		}
	}()
	c, closeIdle := newOverloadClient([]string{servers[0].url, servers[1].url})
	defer closeIdle()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var sessions sessionSampler
	go sessions.run(ctx, env.db.Pool, app)

	phase, capD := time.Second, time.Second
	if overloadFull() {
		phase, capD = 10*time.Second, 5*time.Second
	}
	capacity := max(c.capacity(su.name, capD, 32), 5)
	phases := []*overloadPhase{{name: "normal", mult: 0.5}, {name: "2x", mult: 2}, {name: "5x", mult: 5}, {name: "after", mult: 0.5}}
	var waits []func()
	for _, p := range phases {
		d := phase
		if p.name == "after" && overloadFull() {
			d = 15 * time.Second
		}
		p.run, p.from, p.shed[0] = &overloadRun{}, time.Now(), scrapeShed(servers)
		wait := c.offer(p.run, su.name+"-"+p.name, capacity*p.mult, d)
		if p.name == "normal" || p.name == "after" { // the overload's late answers and retries run on into the next phase
			wait()
		}
		waits = append(waits, wait)
		p.to, p.shed[1] = time.Now(), scrapeShed(servers)
	}
	for _, w := range waits {
		w()
	}
	stop()
	reportOverload(t, su, capacity, phases, servers, &sessions)
	closeIdle() // the clients' idle connections each hold a server goroutine
	for i, s := range servers {
		requireServesAgain(t, su, i, s)
	}
	closed := time.Now()
	for i, s := range servers { // back to where they were? Each one's first statistics after the close
		var m procMax
		for tries := 0; m.samples == 0 && tries < 50; tries++ {
			<-time.After(100 * time.Millisecond) // the next sample (CHARGES_STATS_EVERY=100ms)
			m = serverStats(s, closed.Add(200*time.Millisecond), time.Now())
		}
		t.Logf("%s: server %d once every operation ended and the clients closed their connections: live heap %.1f MiB, %d goroutines, %d connections in use",
			su.name, i, float64(m.heapLive)/(1<<20), m.goroutines, m.poolInUse)
	}
}

// reportOverload logs the setup's table and checks the pass lines in the full tier.
func reportOverload(t *testing.T, su overloadSetup, capacity float64, phases []*overloadPhase, servers []*server, sessions *sessionSampler) {
	t.Logf("overload %s (flags %q): capacity %.0f final answers/s (closed loop, 32 patient clients), load %s", su.name, su.flags, capacity, loadAverage())
	t.Logf("| setup | phase | offered/s | operations | final (give-up / patient) | goodput/s | goodput / capacity | refusals | refusal p99 | refused in engine <= 50 ms | final p50 | final p99 | live heap max (MiB) | goroutines max | pool in use max | idle in tx > 100 ms | lock waits |")
	var base []time.Duration
	for _, p := range phases {
		r := p.run
		r.mu.Lock()
		var refusals, finals []time.Duration
		for _, s := range r.shots {
			switch {
			case s.final():
				finals = append(finals, s.took)
			case s.refusal():
				refusals = append(refusals, s.took)
			}
		}
		ops, fin := r.ops[0]+r.ops[1], r.finals[0]+r.finals[1]
		goodput := float64(fin) / p.to.Sub(p.from).Seconds()
		in, all := p.shed[1].within(p.shed[0], 0.05)
		var heap uint64
		var gor uint64
		var inUse int32
		for _, s := range servers {
			m := serverStats(s, p.from, p.to)
			heap, gor, inUse = max(heap, m.heapLive), max(gor, m.goroutines), max(inUse, m.poolInUse)
		}
		sm := sessions.max(p.from, p.to)
		rp99 := percentile(refusals, 0.99)
		floor := percentile(r.floor, 0.99)
		t.Logf("| %s | %s | %.0f | %d | %d (%d / %d) | %.0f | %.2f | %d | %s | %.0f of %.0f | %s | %s | %.1f | %d | %d | %d | %d |",
			su.name, p.name, float64(ops)/p.to.Sub(p.from).Seconds(), ops, fin, r.finals[0], r.finals[1], goodput, goodput/capacity,
			len(refusals), rp99.Round(time.Millisecond), in, all, percentile(finals, 0.5).Round(time.Millisecond),
			percentile(finals, 0.99).Round(time.Millisecond), float64(heap)/(1<<20), gor, inUse, sm.idleInTx, sm.lockWait)
		t.Logf("%s %s: refusals by engine-side duration %s; a request answered 400 before the engine (no key): p99 %s of %d; sessions idle in a transaction or waiting on a lock ran: %q",
			su.name, p.name, p.shed[1].spread(p.shed[0]), floor.Round(time.Millisecond), len(r.floor), sm.queries)
		require.Empty(t, r.badShot, "%s phase %s: answers neither final nor a refusal with Retry-After", su.name, p.name)
		if overloadFull() && p.mult > 1 {
			target(t, goodput >= 0.8*capacity, "%s phase %s: goodput %.0f/s at least 80%% of the capacity %.0f/s", su.name, p.name, goodput, capacity)
			target(t, rp99 <= 50*time.Millisecond, "%s phase %s: refusals p99 %s within 50ms", su.name, p.name, rp99.Round(time.Millisecond))
		}
		if p.name == "normal" {
			base = finals
		}
		if p.name == "after" {
			back, line := recovery(base, r.shots, p.from)
			t.Logf("%s: back to normal %s", su.name, line)
			if overloadFull() {
				target(t, back >= 0 && back <= 10*time.Second, "%s: back to normal latency within 10s of the overload's end: %s", su.name, line)
			}
		}
		r.mu.Unlock()
	}
}

// target logs one of issue 23's timing targets as met or not met, with the load
// average: on a shared 2-core machine they measure the machine as much as the engine,
// so they are reported (docs/RELIABILITY.md), never asserted.
func target(t *testing.T, met bool, format string, args ...any) {
	t.Helper()
	verdict := "met"
	if !met {
		verdict = "NOT met"
	}
	t.Logf("target %s (load %s): "+format, append([]any{verdict, loadAverage()}, args...)...)
}

// servesAgainOps is how many operations, one after another, each server must answer
// with the charge made once the overload's every operation ended.
const servesAgainOps = 10

// requireServesAgain checks that server s recovered from the overload: with every
// operation of the experiment ended, servesAgainOps new operations sent one at a time
// each get the charge made (201) at the first try. Nothing else is in flight then, so a
// refusal would be admission still counting the crowd that left; the count, not a
// time, is the test, and the client's timeout only stops a hang.
func requireServesAgain(t *testing.T, su overloadSetup, i int, s *server) {
	client := &http.Client{Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	for n := range servesAgainOps {
		body := fmt.Sprintf(`{"amount":%d,"currency":"usd","source":"tok_visa"}`, 1+n)
		req, err := http.NewRequest(http.MethodPost, s.url+chargesRoute, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer acct")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-again-%d-%d", su.name, i, n))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		require.NoError(t, err, "%s: server %d, operation %d after the overload", su.name, i, n)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s: server %d, operation %d after the overload (Retry-After %q): want the charge made",
			su.name, i, n, resp.Header.Get("Retry-After"))
	}
}

// recovery is how long after from the final answers' latency was back to normal:
// the start of the first three seconds in a row whose final answers' p50 each stays
// within 1.2x of the normal phase's p50 (at least 10ms more: the machine is shared),
// and a line saying
// so with the figures; -1 when it never was.
func recovery(base []time.Duration, shots []shot, from time.Time) (time.Duration, string) {
	p50 := percentile(base, 0.5)
	limit := max(p50*12/10, p50+10*time.Millisecond)
	var secs [][]time.Duration
	for _, s := range shots {
		if !s.final() {
			continue
		}
		i := int(s.at.Sub(from) / time.Second)
		for len(secs) <= i {
			secs = append(secs, nil)
		}
		secs[i] = append(secs[i], s.took)
	}
	back, run := -1, 0 // the first of three seconds in a row within the limit
	var per []string
	for i, ds := range secs {
		m := percentile(ds, 0.5)
		per = append(per, m.Round(time.Millisecond).String())
		switch {
		case len(ds) > 0 && m <= limit:
			run++
		case len(ds) > 0:
			run = 0
		}
		if run == 3 && back < 0 {
			back = i - 2
		}
	}
	line := fmt.Sprintf("(normal p50 %s p99 %s; p50 each second after the overload: %s)", p50.Round(time.Millisecond),
		percentile(base, 0.99).Round(time.Millisecond), strings.Join(per, " "))
	if back < 0 {
		return -1, "never within the phase " + line
	}
	return time.Duration(back) * time.Second, fmt.Sprintf("after %ds %s", back, line)
}

// loadAverage is the machine's load average, from /proc (the experiment shares its
// cores).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
