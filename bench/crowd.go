package main

// The crowd part (issue 39 item 3): goodput under a crowd four times the server's
// capacity whose clients give up after 1 s and retry at once. Three processes: the
// bench (this one) runs the rounds; a server process (the hidden subcommand
// crowdServerCommand) serves the charges API as `charges serve` does (idemhttp.Handler,
// the charges flow with Go-code phases, the fake provider in-process, a pool of 4, the
// engine's admission at its defaults unless -crowd-max-in-flight or
// -crowd-admit-wait say otherwise); and the load generator (crowdCommand, crowdgen.go),
// a process of its own so that it can be pinned. In each round and each mode (pinned: the
// generator on CPU -crowd-cpu and the server on the others, with taskset; unpinned:
// neither), interleaved, a fresh server is started and measured twice:
//
//   - baseline: -crowd-conc closed loops of patient clients (a new key per charge,
//     retried at once with the same key after a refusal), for -crowd-base after a
//     second of warm-up: charges/s is the capacity;
//   - crowd: new charges arrive open-loop at 4× that rate for -crowd-dur; each client
//     gives up on an attempt after 1 s (-crowd-timeout) and retries it at once with the
//     same key, as it does after any refusal, until the charge is answered (201) or the
//     phase ends. At most -crowd-live charges are under way at once (arrivals beyond
//     are dropped and counted): the generator's loops are bounded in count and time.
//
// Goodput is the charges answered 201 per second of the crowd phase; the line is
// goodput ≥ 0.5× the same mode's baseline. Postgres is not pinned (the machine's
// server, or the bench's throwaway one). Each round also logs where the time can go:
// connections accepted and dialled (a give-up closes its connection), and how long
// both processes waited for a CPU (schedstat) and their goroutines for Go's scheduler.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/workflow"
)

// The crowd part's hidden subcommands.
const (
	crowdServerCommand = "__crowdserver"
	crowdCommand       = "__crowd"
)

// crowdMult is the crowd's offered load as a multiple of the baseline's charges/s.
const crowdMult = 4

// figCrowdPinned is the crowd part's figure: goodput under the crowd ÷ the baseline,
// median over rounds, the generator pinned; its text also gives the unpinned runs'.
const figCrowdPinned = "crowd.pinned"

// crowdChecks are issue 39's lines for the crowd.
var crowdChecks = []check{
	{"issue 39", "Crowd 4× capacity, clients give up after 1 s and retry at once (charges server, loopback HTTP): goodput vs the no-crowd baseline, load generator pinned to its own core (unpinned: reported beside it)",
		"≥ 0.5× baseline", "crowd", read(figCrowdPinned), atLeast(0.5)},
}

// crowdServerStats is what the crowd server's stats route answers.
type crowdServerStats struct {
	CPU      time.Duration `json:"cpu_ns"`
	Allocs   uint64        `json:"allocs"`
	Requests int64         `json:"requests"` // charge requests answered
	// The pool's counters: connections opened, acquires that waited, that were
	// cancelled, and the time spent acquiring.
	NewConns      int64         `json:"new_conns"`
	EmptyAcquires int64         `json:"empty_acquires"`
	CanceledAcq   int64         `json:"canceled_acquires"`
	AcquireWait   time.Duration `json:"acquire_wait_ns"`
	// Slow: charge requests whose handler took over crowdSlow (counted when it
	// returned), and Gone: those whose client had gone by then.
	Slow int64 `json:"slow"`
	Gone int64 `json:"gone"`
	// Conns: connections accepted; RunDelay: the time the server's threads spent
	// runnable, waiting for a CPU (schedstat).
	Conns    int64         `json:"conns"`
	RunDelay time.Duration `json:"run_delay_ns"`
	// Sched is the counts of the Go runtime's histogram of goroutines' runnable
	// waits so far (schedCounts); SchedWaits the phase's, from two of them.
	Sched      []uint64   `json:"sched"`
	SchedWaits schedWaits `json:"-"`
}

// crowdSlow is the handler time over which the crowd server counts a request slow: a
// client giving up after 1 s can hardly have its answer.
const crowdSlow = 900 * time.Millisecond

// runCrowdServer is the crowd part's server process: it serves the charges API on a
// loopback port, prints the address, and serves until stdin closes.
func runCrowdServer(args []string) error {
	fs := flag.NewFlagSet(crowdServerCommand, flag.ContinueOnError)
	db := childDBFlags(fs)
	maxInFlight := fs.Int("max-in-flight", 0, "workflow.Config.MaxInFlight")
	admitWait := fs.Duration("admit-wait", 0, "workflow.Config.AdmitWait")
	shedHold := fs.Duration("shed-hold", 0, "idemhttp.Config.ShedHold")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	pool, err := db.pool(ctx, appLive, 4) // pgx's default on 2 cores, as charges serve has
	if err != nil {
		return err
	}
	defer pool.Close()
	provider := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	defer provider.Close()
	eng, err := workflow.New(pool, &workflow.Config{MaxInFlight: *maxInFlight, AdmitWait: *admitWait,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	if err := eng.Register(chargeflow.Flow(&chargeflow.ProviderClient{BaseURL: provider.URL, HTTP: provider.Client()})); err != nil {
		return err
	}
	h, err := idemhttp.Handler(eng, chargeflow.FlowName, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
		return r.Header.Get(refusalScope), nil
	}, ShedHold: *shedHold})
	if err != nil {
		return err
	}
	var requests, slow, gone, conns atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST "+chargeRoute, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		requests.Add(1)
		if time.Since(start) > crowdSlow {
			slow.Add(1)
		}
		if r.Context().Err() != nil {
			gone.Add(1)
		}
	}))
	handleChildStats(mux, func() crowdServerStats {
		ps := pool.Stat()
		return crowdServerStats{CPU: cpumeter.Self(), Allocs: heapAllocs(), Requests: requests.Load(),
			NewConns: ps.NewConnsCount(), EmptyAcquires: ps.EmptyAcquireCount(), CanceledAcq: ps.CanceledAcquireCount(), AcquireWait: ps.AcquireDuration(),
			Slow: slow.Load(), Gone: gone.Load(), Conns: conns.Load(), RunDelay: selfRunDelay(), Sched: schedCounts()}
	})
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	// charges serve's timeouts (examples/charges newHTTPServer).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}}
	if err := serveChild(srv); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = eng.Drain(sctx)
	return srv.Close()
}

// crowdPhase is one phase's figures: the generator's counts and the server's CPU.
type crowdPhase struct {
	crowdCounts
	ServerUS     float64          // server CPU per charge request answered, µs
	ServerAllocs float64          // server heap allocations per request
	Requests     int64            // charge requests the server answered in the phase
	Load         string           // uptime at the phase's end
	Pool         crowdServerStats // the pool's counters over the phase
}

// rate is the phase's charges per second.
func (p crowdPhase) rate() float64 { return float64(p.Charges) / p.Seconds }

// crowdRun is one mode's run in one round.
type crowdRun struct {
	Pinned          bool
	Baseline, Crowd crowdPhase
}

// crowdRounds runs the crowd part and hands its figures to the budget.
func (e *env) crowdRounds(ctx context.Context) error {
	if _, err := exec.LookPath("taskset"); err != nil {
		return fmt.Errorf("crowd: the pinned runs need taskset (util-linux): %w", err)
	}
	if runtime.NumCPU() < 2 {
		return errors.New("crowd: pinning the load generator to its own core needs 2 CPUs")
	}
	logf("crowd: start, %s", uptime())
	var runs []crowdRun
	for r := range e.o.rounds {
		modes := []bool{true, false}
		if r%2 == 1 {
			slices.Reverse(modes)
		}
		for _, pinned := range modes {
			run, err := e.crowdRun(ctx, r, pinned)
			if err != nil {
				return err
			}
			runs = append(runs, run)
		}
	}
	e.setCrowdFigures(runs)
	return nil
}

// crowdServer is a running crowd server process and how to reach it.
type crowdServer struct {
	base  string       // its URL
	stats *http.Client // reads its stats
	stop  func()       // closes its stdin and waits for it
}

// crowdRun starts a server and measures the baseline, then the crowd.
func (e *env) crowdRun(ctx context.Context, round int, pinned bool) (crowdRun, error) {
	o := e.o
	run := crowdRun{Pinned: pinned}
	srv, err := e.startCrowdServer(ctx, pinned)
	if err != nil {
		return run, err
	}
	defer srv.stop()
	mode := map[bool]string{true: "pinned", false: "unpinned"}[pinned]
	prefix := fmt.Sprintf("crowd-%s-%d-%s", e.runID, round, mode)
	if run.Baseline, err = e.crowdPhase(ctx, srv, pinned, "-mode", "baseline", "-conc", strconv.Itoa(o.crowdConc),
		"-dur", o.crowdBase.String(), "-prefix", prefix+"-base"); err != nil {
		return run, err
	}
	rate := crowdMult * run.Baseline.rate()
	if rate <= 0 {
		return run, errors.New("crowd: the baseline made no charge")
	}
	var profile chan error
	if o.crowdProfile != "" && !pinned && round == 0 {
		profile = make(chan error, 1)
		go func() { profile <- crowdProfile(ctx, srv.base, o.crowdDur, o.crowdProfile) }()
	}
	if run.Crowd, err = e.crowdPhase(ctx, srv, pinned, "-mode", "crowd", "-rate", strconv.FormatFloat(rate, 'f', 1, 64),
		"-dur", o.crowdDur.String(), "-timeout", o.crowdTimeout.String(), "-live", strconv.Itoa(o.crowdLive),
		"-prefix", prefix+"-crowd"); err != nil {
		return run, err
	}
	if profile != nil {
		if err := <-profile; err != nil {
			logf("crowd: the server's CPU profile: %v", err)
		}
	}
	e.logCrowdRun(round, mode, rate, run)
	return run, nil
}

// crowdPin is the command prefix that pins a process to the cpus (taskset) when
// pinned, else nil.
func crowdPin(pinned bool, cpus string) []string {
	if !pinned {
		return nil
	}
	return []string{"taskset", "-c", cpus}
}

// startCrowdServer starts a crowd server process (pinned: on every CPU but the
// generator's) and reads its address.
func (e *env) startCrowdServer(ctx context.Context, pinned bool) (*crowdServer, error) {
	o := e.o
	var serverCPUs []string
	for c := range runtime.NumCPU() {
		if c != o.crowdCPU {
			serverCPUs = append(serverCPUs, strconv.Itoa(c))
		}
	}
	kid, err := e.startChild(ctx, "the crowd's server process", crowdPin(pinned, strings.Join(serverCPUs, ",")), crowdServerCommand,
		"-max-in-flight", strconv.Itoa(o.crowdMaxInFlight), "-admit-wait", o.crowdAdmitWait.String(), "-shed-hold", o.crowdShedHold.String())
	if err != nil {
		return nil, err
	}
	stats := &http.Client{Timeout: 30 * time.Second}
	srv := &crowdServer{stats: stats, stop: func() {
		stats.CloseIdleConnections()
		kid.stop()
	}}
	if srv.base, err = kid.baseURL(); err != nil {
		srv.stop()
		return nil, err
	}
	return srv, nil
}

// crowdPhase runs the load generator once (pinned: on its own CPU) with genArgs, and
// reads its counts and the server's stats before and after.
func (e *env) crowdPhase(ctx context.Context, srv *crowdServer, pinned bool, genArgs ...string) (crowdPhase, error) {
	gen, err := selfCommand(ctx, crowdPin(pinned, strconv.Itoa(e.o.crowdCPU)), crowdCommand,
		append([]string{"-url", srv.base, "-client", e.o.crowdClient}, genArgs...)...)
	if err != nil {
		return crowdPhase{}, err
	}
	before, err := crowdServerRead(ctx, srv.stats, srv.base)
	if err != nil {
		return crowdPhase{}, err
	}
	b, err := gen.Output()
	if err != nil {
		return crowdPhase{}, fmt.Errorf("crowd: the load generator: %w", err)
	}
	after, err := crowdServerRead(ctx, srv.stats, srv.base)
	if err != nil {
		return crowdPhase{}, err
	}
	var p crowdPhase
	if err := json.Unmarshal(b, &p.crowdCounts); err != nil {
		return crowdPhase{}, fmt.Errorf("crowd: the load generator's counts: %w", err)
	}
	p.setServer(before, after)
	p.Load = uptime()
	return p, nil
}

// setServer sets p's server figures from its stats before and after the phase. They
// span the generator's whole run (warm-up and the ends included): per request they do
// not depend on the window.
func (p *crowdPhase) setServer(before, after crowdServerStats) {
	p.Requests = after.Requests - before.Requests
	if p.Requests > 0 {
		p.ServerUS = float64(after.CPU-before.CPU) / float64(time.Microsecond) / float64(p.Requests)
		p.ServerAllocs = float64(after.Allocs-before.Allocs) / float64(p.Requests)
	}
	p.Pool = crowdServerStats{NewConns: after.NewConns - before.NewConns, EmptyAcquires: after.EmptyAcquires - before.EmptyAcquires,
		CanceledAcq: after.CanceledAcq - before.CanceledAcq, AcquireWait: after.AcquireWait - before.AcquireWait,
		Slow: after.Slow - before.Slow, Gone: after.Gone - before.Gone, Conns: after.Conns - before.Conns,
		RunDelay: after.RunDelay - before.RunDelay, CPU: after.CPU - before.CPU, SchedWaits: schedWaitsBetween(before.Sched, after.Sched)}
}

// logCrowdRun logs one run's figures.
func (e *env) logCrowdRun(round int, mode string, rate float64, run crowdRun) {
	o := e.o
	b, c := run.Baseline, run.Crowd
	logf("crowd round %d %s: baseline %.0f charges/s (%d closed loops; %d refusals with Retry-After; server %.0f µs CPU, %.0f allocations per request over %d requests; %d new pool connections; generator CPU %.2f cores; %s)",
		round+1, mode, b.rate(), o.crowdConc, b.RefusedRA, b.ServerUS, b.ServerAllocs, b.Requests, b.Pool.NewConns, b.CPU/1e6/b.Seconds, b.Load)
	logf("crowd round %d %s: crowd of %.0f new charges/s (%d×), attempts given up after %s: goodput %.0f charges/s = %.2f× baseline; "+
		"%d refusals with Retry-After, %d 5xx without, %d in progress (409), %d client time-outs, %d transport errors, %d other answers; "+
		"%d charges begun, %d arrivals dropped (%d under way at most); server %.1f µs CPU, %.1f allocations per request over %d requests (%.0f requests/s), "+
		"%d of them took the handler over %s, %d were answered after their client had gone; "+
		"its pool: %d new connections, %d acquires waited (%d cancelled), %s waiting in all; "+
		"connections: %d accepted by the server, %d dialled by the generator in the window; "+
		"CPU: server %.2f cores, generator %.2f cores (%.0f µs per attempt); waiting for a CPU: server %.2f, generator %.2f thread-seconds per second; "+
		"goroutines waiting for Go's scheduler over 100 ms: server %.1f%% of %d wake-ups (p99 %s), generator %.1f%% of %d (p99 %s); %s",
		round+1, mode, rate, crowdMult, o.crowdTimeout, c.rate(), c.rate()/b.rate(),
		c.RefusedRA, c.RefusedNoRA, c.InProgress, c.TimedOut, c.Errors, c.Other, c.Started, c.Dropped, o.crowdLive,
		c.ServerUS, c.ServerAllocs, c.Requests, float64(c.Requests)/c.Seconds, c.Pool.Slow, crowdSlow, c.Pool.Gone,
		c.Pool.NewConns, c.Pool.EmptyAcquires, c.Pool.CanceledAcq, c.Pool.AcquireWait.Round(time.Millisecond),
		c.Pool.Conns, c.Dials, c.Pool.CPU.Seconds()/c.Seconds, c.CPU/1e6/c.Seconds, c.CPU/float64(max(c.attempts(), 1)),
		c.Pool.RunDelay.Seconds()/c.Seconds, c.RunDelay/1e6/c.Seconds,
		100*c.Pool.SchedWaits.Over, c.Pool.SchedWaits.Wakeups, c.Pool.SchedWaits.P99.Round(time.Microsecond),
		100*c.Sched.Over, c.Sched.Wakeups, c.Sched.P99.Round(time.Microsecond), c.Load)
}

// attempts is the phase's attempts in the window that ended (answered, given up or
// failed).
func (c crowdCounts) attempts() int64 {
	return c.Charges + c.RefusedRA + c.RefusedNoRA + c.InProgress + c.TimedOut + c.Errors + c.Other
}

// crowdProfile writes a CPU profile of the server during the crowd phase (its length
// less a second at each end) to path.
func crowdProfile(ctx context.Context, base string, dur time.Duration, path string) error {
	secs := max(int(dur.Seconds())-2, 1)
	<-time.After(time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Duration(secs+30) * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	logf("crowd: the server's CPU profile under the crowd (%d s, unpinned, round 1) is in %s", secs, path)
	return f.Close()
}

// crowdServerRead reads the crowd server's stats.
func crowdServerRead(ctx context.Context, client *http.Client, base string) (crowdServerStats, error) {
	return readChildStats[crowdServerStats](ctx, client, base, "crowd: read the server's stats")
}

// setCrowdFigures hands the median over rounds of goodput ÷ baseline, the generator
// pinned, to the budget, with the unpinned runs' beside it.
func (e *env) setCrowdFigures(runs []crowdRun) {
	var val float64
	var texts []string
	for _, pinned := range []bool{true, false} {
		var ratios, base, good, srvBase, srvCrowd []float64
		for _, r := range runs {
			if r.Pinned != pinned {
				continue
			}
			ratios = append(ratios, r.Crowd.rate()/r.Baseline.rate())
			base, good = append(base, r.Baseline.rate()), append(good, r.Crowd.rate())
			srvBase, srvCrowd = append(srvBase, r.Baseline.ServerUS), append(srvCrowd, r.Crowd.ServerUS)
		}
		how := "unpinned"
		if pinned {
			val, how = median(ratios), fmt.Sprintf("pinned (generator on CPU %d, server on the others)", e.o.crowdCPU)
		}
		texts = append(texts, fmt.Sprintf("%s: %.0f vs %.0f charges/s = %.2f× (rounds: %.2f–%.2f×), server CPU %.0f µs per request under the crowd, %.0f µs in the baseline",
			how, median(good), median(base), median(ratios), slices.Min(ratios), slices.Max(ratios), median(srvCrowd), median(srvBase)))
	}
	settings := fmt.Sprintf("server MaxInFlight %d, AdmitWait %s (0: the defaults), ShedHold %s", e.o.crowdMaxInFlight, e.o.crowdAdmitWait, e.o.crowdShedHold)
	e.figs.set(figCrowdPinned, val, fmt.Sprintf("%s; %s; %s; %d rounds; %s", texts[0], texts[1], settings, e.o.rounds, uptime()))
}

// uptime is uptime(1)'s line, or the load average when it cannot run.
func uptime() string {
	b, err := exec.Command("uptime").Output()
	if err != nil {
		return "load average " + loadAverage()
	}
	return strings.TrimSpace(string(b))
}
