package main

// The crowd part (issue 39 item 3): goodput under a crowd four times the server's
// capacity whose clients give up after 1 s and retry at once. Three processes: the
// bench (this one) runs the rounds; a server process (the hidden subcommand
// crowdServerCommand) serves the charges API as `charges serve` does (idemhttp.Handler,
// the charges flow with Go-code phases, the fake provider in-process, a pool of 4, the
// engine's admission at its defaults unless -crowd-max-in-flight or
// -crowd-admit-wait say otherwise); and the load generator (crowdCommand), a process of
// its own so that it can be pinned. In each round and each mode (pinned: the
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
// server, or the bench's throwaway one).

import (
	"bufio"
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
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
	}})
	if err != nil {
		return err
	}
	var requests, slow, gone atomic.Int64
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
	mux.HandleFunc("GET "+refusalStatsPath, func(w http.ResponseWriter, _ *http.Request) {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		ps := pool.Stat()
		st := crowdServerStats{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), Allocs: heapAllocs(), Requests: requests.Load(),
			NewConns: ps.NewConnsCount(), EmptyAcquires: ps.EmptyAcquireCount(), CanceledAcq: ps.CanceledAcquireCount(), AcquireWait: ps.AcquireDuration(),
			Slow: slow.Load(), Gone: gone.Load()}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// charges serve's timeouts (examples/charges newHTTPServer).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the bench closes it
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = eng.Drain(sctx)
	return srv.Close()
}

// crowdCounts is what the load generator counts in one phase.
type crowdCounts struct {
	Seconds     float64 `json:"seconds"`      // measured window
	Charges     int64   `json:"charges"`      // 201 answers in the window
	Started     int64   `json:"started"`      // charges begun in the window
	Dropped     int64   `json:"dropped"`      // arrivals not begun: -live charges under way
	RefusedRA   int64   `json:"refused_ra"`   // 503 with Retry-After
	RefusedNoRA int64   `json:"refused_nora"` // 5xx without Retry-After
	InProgress  int64   `json:"in_progress"`  // 409
	TimedOut    int64   `json:"timed_out"`    // attempts given up after the timeout
	Errors      int64   `json:"errors"`       // other transport errors (connection refused, reset)
	Other       int64   `json:"other"`        // other final answers (4xx)
	CPU         float64 `json:"cpu_us"`       // the generator's CPU in the window, µs
}

// runCrowd is the load generator: one phase, baseline (closed loops) or crowd (open
// loop at -rate), printed as one JSON line of crowdCounts.
func runCrowd(args []string) error {
	fs := flag.NewFlagSet(crowdCommand, flag.ContinueOnError)
	base := fs.String("url", "", "server base URL")
	mode := fs.String("mode", "baseline", "baseline or crowd")
	conc := fs.Int("conc", 32, "baseline: closed loops")
	rate := fs.Float64("rate", 0, "crowd: new charges per second")
	dur := fs.Duration("dur", 5*time.Second, "measured window")
	warm := fs.Duration("warmup", time.Second, "baseline: warm-up before the window")
	timeout := fs.Duration("timeout", time.Second, "crowd: an attempt is given up after this long")
	live := fs.Int("live", 4096, "crowd: charges under way at most")
	prefix := fs.String("prefix", "crowd", "key prefix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	g := &crowdGen{base: *base, prefix: *prefix, client: &http.Client{Transport: &http.Transport{
		MaxIdleConns: *live + *conc, MaxIdleConnsPerHost: *live + *conc, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}}
	var c crowdCounts
	var err error
	switch *mode {
	case "baseline":
		c, err = g.baseline(*conc, *warm, *dur)
	case "crowd":
		c, err = g.crowd(*rate, *dur, *timeout, *live)
	default:
		err = fmt.Errorf("-mode %q: want baseline or crowd", *mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(c)
}

// crowdGen sends the charges of one phase.
type crowdGen struct {
	base, prefix string
	client       *http.Client
	next         atomic.Int64
	counting     atomic.Bool // inside the measured window
	c            struct{ charges, started, dropped, refusedRA, refusedNoRA, inProgress, timedOut, errors, other atomic.Int64 }
}

// count adds 1 to n when inside the window.
func (g *crowdGen) count(n *atomic.Int64) {
	if g.counting.Load() {
		n.Add(1)
	}
}

// charge makes one charge under a new key: attempts until one is answered finally or
// ctx ends, each bounded by timeout (0: none), retried at once after a refusal, a
// time-out or a transport error.
func (g *crowdGen) charge(ctx context.Context, timeout time.Duration) {
	key := g.prefix + "-" + strconv.FormatInt(g.next.Add(1), 10)
	g.count(&g.c.started)
	for ctx.Err() == nil {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, timeout)
		}
		status, ra, err := g.attempt(actx, key)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case timedOut:
			g.count(&g.c.timedOut)
		case ctx.Err() != nil:
			return
		case err != nil:
			g.count(&g.c.errors)
		case status == http.StatusCreated:
			g.count(&g.c.charges)
			return
		case status == http.StatusConflict:
			g.count(&g.c.inProgress)
		case status >= 500 && ra:
			g.count(&g.c.refusedRA)
		case status >= 500:
			g.count(&g.c.refusedNoRA)
		default:
			g.count(&g.c.other)
			return
		}
	}
}

// attempt sends one attempt of the charge under key.
func (g *crowdGen) attempt(ctx context.Context, key string) (status int, retryAfter bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+chargeRoute, strings.NewReader(string(chargeBody)))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(refusalScope, "acct_crowd")
	req.Header.Set(idemhttp.KeyHeader, key)
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After") != "", err
}

// window runs the measured window of length dur, from now, and returns the counts.
func (g *crowdGen) window(dur time.Duration) crowdCounts {
	cpu0 := selfCPU()
	g.counting.Store(true)
	start := time.Now()
	<-time.After(dur)
	g.counting.Store(false)
	c := &g.c
	return crowdCounts{Seconds: time.Since(start).Seconds(), Charges: c.charges.Load(), Started: c.started.Load(), Dropped: c.dropped.Load(),
		RefusedRA: c.refusedRA.Load(), RefusedNoRA: c.refusedNoRA.Load(), InProgress: c.inProgress.Load(),
		TimedOut: c.timedOut.Load(), Errors: c.errors.Load(), Other: c.other.Load(),
		CPU: float64(selfCPU()-cpu0) / float64(time.Microsecond)}
}

// baseline runs conc closed loops of patient clients: warm-up, then the window.
func (g *crowdGen) baseline(conc int, warm, dur time.Duration) (crowdCounts, error) {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				g.charge(ctx, 0)
			}
		})
	}
	<-time.After(warm)
	c := g.window(dur)
	stop()
	wg.Wait()
	return c, nil
}

// crowd offers new charges open-loop at rate per second for dur, each attempt given
// up after timeout; at most live charges under way.
func (g *crowdGen) crowd(rate float64, dur, timeout time.Duration, live int) (crowdCounts, error) {
	if rate <= 0 {
		return crowdCounts{}, errors.New("-rate must be positive")
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var under atomic.Int64
	done := make(chan crowdCounts, 1)
	go func() { done <- g.window(dur) }()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var begun int64
	for range tick.C {
		elapsed := time.Since(start)
		if elapsed >= dur {
			break
		}
		for due := int64(rate * elapsed.Seconds()); begun < due; begun++ {
			if under.Load() >= int64(live) {
				g.count(&g.c.dropped)
				continue
			}
			under.Add(1)
			wg.Go(func() {
				defer under.Add(-1)
				g.charge(ctx, timeout)
			})
		}
	}
	c := <-done
	stop()
	wg.Wait()
	return c, nil
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// crowdRun starts a server and measures the baseline, then the crowd.
func (e *env) crowdRun(ctx context.Context, round int, pinned bool) (crowdRun, error) {
	o := e.o
	run := crowdRun{Pinned: pinned}
	exe, err := os.Executable()
	if err != nil {
		return run, err
	}
	genCPU := strconv.Itoa(o.crowdCPU)
	var serverCPUs []string
	for c := range runtime.NumCPU() {
		if c != o.crowdCPU {
			serverCPUs = append(serverCPUs, strconv.Itoa(c))
		}
	}
	pin := func(cpus string, argv ...string) []string {
		if !pinned {
			return argv
		}
		return append([]string{"taskset", "-c", cpus}, argv...)
	}
	args := append([]string{exe, crowdServerCommand}, e.db.childArgs()...)
	args = append(args, "-max-in-flight", strconv.Itoa(o.crowdMaxInFlight), "-admit-wait", o.crowdAdmitWait.String())
	argv := pin(strings.Join(serverCPUs, ","), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return run, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return run, err
	}
	if err := cmd.Start(); err != nil {
		return run, fmt.Errorf("start the crowd's server process: %w", err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	if !out.Scan() {
		return run, errors.New("the crowd's server process did not say its address")
	}
	base := "http://" + out.Text()
	stats := &http.Client{Timeout: 30 * time.Second}
	defer stats.CloseIdleConnections()
	mode := map[bool]string{true: "pinned", false: "unpinned"}[pinned]
	prefix := fmt.Sprintf("crowd-%s-%d-%s", e.runID, round, mode)

	phase := func(genArgs ...string) (crowdPhase, error) {
		before, err := crowdServerRead(ctx, stats, base)
		if err != nil {
			return crowdPhase{}, err
		}
		a := append([]string{exe, crowdCommand, "-url", base}, genArgs...)
		a = pin(genCPU, a...)
		gen := exec.CommandContext(ctx, a[0], a[1:]...)
		gen.Stderr = os.Stderr
		b, err := gen.Output()
		if err != nil {
			return crowdPhase{}, fmt.Errorf("crowd: the load generator: %w", err)
		}
		after, err := crowdServerRead(ctx, stats, base)
		if err != nil {
			return crowdPhase{}, err
		}
		var p crowdPhase
		if err := json.Unmarshal(b, &p.crowdCounts); err != nil {
			return crowdPhase{}, fmt.Errorf("crowd: the load generator's counts: %w", err)
		}
		// The server's figures span the generator's whole run (warm-up and the ends
		// included): per request they do not depend on the window.
		p.Requests = after.Requests - before.Requests
		if p.Requests > 0 {
			p.ServerUS = float64(after.CPU-before.CPU) / float64(time.Microsecond) / float64(p.Requests)
			p.ServerAllocs = float64(after.Allocs-before.Allocs) / float64(p.Requests)
		}
		p.Load = uptime()
		p.Pool = crowdServerStats{NewConns: after.NewConns - before.NewConns, EmptyAcquires: after.EmptyAcquires - before.EmptyAcquires,
			CanceledAcq: after.CanceledAcq - before.CanceledAcq, AcquireWait: after.AcquireWait - before.AcquireWait,
			Slow: after.Slow - before.Slow, Gone: after.Gone - before.Gone}
		return p, nil
	}
	if run.Baseline, err = phase("-mode", "baseline", "-conc", strconv.Itoa(o.crowdConc), "-dur", o.crowdBase.String(), "-prefix", prefix+"-base"); err != nil {
		return run, err
	}
	rate := crowdMult * run.Baseline.rate()
	if rate <= 0 {
		return run, errors.New("crowd: the baseline made no charge")
	}
	var profile chan error
	if o.crowdProfile != "" && !pinned && round == 0 {
		profile = make(chan error, 1)
		go func() { profile <- crowdProfile(ctx, base, o.crowdDur, o.crowdProfile) }()
	}
	if run.Crowd, err = phase("-mode", "crowd", "-rate", strconv.FormatFloat(rate, 'f', 1, 64), "-dur", o.crowdDur.String(),
		"-timeout", o.crowdTimeout.String(), "-live", strconv.Itoa(o.crowdLive), "-prefix", prefix+"-crowd"); err != nil {
		return run, err
	}
	if profile != nil {
		if err := <-profile; err != nil {
			logf("crowd: the server's CPU profile: %v", err)
		}
	}
	b, c := run.Baseline, run.Crowd
	logf("crowd round %d %s: baseline %.0f charges/s (%d closed loops; %d refusals with Retry-After; server %.0f µs CPU, %.0f allocations per request over %d requests; %d new pool connections; generator CPU %.2f cores; %s)",
		round+1, mode, b.rate(), o.crowdConc, b.RefusedRA, b.ServerUS, b.ServerAllocs, b.Requests, b.Pool.NewConns, b.CPU/1e6/b.Seconds, b.Load)
	logf("crowd round %d %s: crowd of %.0f new charges/s (%d×), attempts given up after %s: goodput %.0f charges/s = %.2f× baseline; "+
		"%d refusals with Retry-After, %d 5xx without, %d in progress (409), %d client time-outs, %d transport errors, %d other answers; "+
		"%d charges begun, %d arrivals dropped (%d under way at most); server %.1f µs CPU, %.1f allocations per request over %d requests (%.0f requests/s), "+
		"%d of them took the handler over %s, %d were answered after their client had gone; "+
		"its pool: %d new connections, %d acquires waited (%d cancelled), %s waiting in all; generator CPU %.2f cores; %s",
		round+1, mode, rate, crowdMult, o.crowdTimeout, c.rate(), c.rate()/b.rate(),
		c.RefusedRA, c.RefusedNoRA, c.InProgress, c.TimedOut, c.Errors, c.Other, c.Started, c.Dropped, o.crowdLive,
		c.ServerUS, c.ServerAllocs, c.Requests, float64(c.Requests)/c.Seconds, c.Pool.Slow, crowdSlow, c.Pool.Gone,
		c.Pool.NewConns, c.Pool.EmptyAcquires, c.Pool.CanceledAcq, c.Pool.AcquireWait.Round(time.Millisecond), c.CPU/1e6/c.Seconds, c.Load)
	return run, nil
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
	settings := fmt.Sprintf("server MaxInFlight %d, AdmitWait %s (0: the defaults)", e.o.crowdMaxInFlight, e.o.crowdAdmitWait)
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
