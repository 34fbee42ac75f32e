package main

// The refusals part (issue 39 item 3): what a refused request costs. A refusal must
// cost about what a bare 503 costs, or under a crowd the refusals themselves eat the
// capacity. A server process of its own (the hidden subcommand refuserCommand, so that
// its CPU is read apart from the client's) serves, on one loopback listener and one
// http.Server, two routes:
//
//   - idemhttp: idemhttp.Handler on a real engine with the charges flow registered,
//     drained (workflow.Engine.Drain) before the first request, so that it refuses
//     every attempt before its claim: 503 unavailable, Retry-After, the problem
//     document, the attempt hooks run. Drained is the cheapest honest refusing engine:
//     nothing is in flight, no statement is sent, and every attempt takes the same path
//     through admission as an overloaded engine's turned away at once.
//   - overloaded: idemhttp.Handler on a second engine, overloaded: MaxInFlight 1, its
//     one place held for the whole run by an attempt of a flow whose call phase never
//     returns, AdmitWait 4ms. A refused request's body is not read (its length is
//     declared). After the first waits (4 ms each, ended by AdmitWait) an arrival
//     while another waits is turned away at once, as under a crowd (the queue is
//     hopeless: the last waits took over a quarter of AdmitWait); one that finds
//     nobody waiting waits its 4 ms. With closed loops, nearly every refusal is the
//     one at once; the figure is their mix.
//   - bare: a plain net/http handler that answers 503 with Retry-After: 1, reading
//     nothing. The floor.
//
// The bench's client sends the same keyed charge request (a new key each time) to each
// in closed loops, in interleaved rounds (the side that goes first alternates), and
// reads the server process's CPU (getrusage) and heap allocations
// (runtime/metrics) from a third route before and after each side's round, and its own
// CPU and allocations around it.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/workflow"
)

// refuserCommand is the hidden subcommand that runs the refusals part's server process.
const refuserCommand = "__refuser"

// The refuser's routes.
const (
	refusalIdemPath = chargeRoute
	refusalOverPath = "/overloaded" + chargeRoute
	refusalBarePath = "/bare" + chargeRoute
	refusalScope    = "X-Account" // the header the handler's Scope reads
)

// The refusals part's figures, set by refusals.
const (
	// figRefusalServer: the server process's CPU per refused request, idemhttp ÷ bare,
	// median over rounds of the per-round ratio.
	figRefusalServer = "refusals.server"
	// figRefusalTotal: the same for server + client CPU.
	figRefusalTotal = "refusals.total"
	// figRefusalOverServer and figRefusalOverTotal: the same for the overloaded engine.
	figRefusalOverServer = "refusals.over.server"
	figRefusalOverTotal  = "refusals.over.total"
)

// refusalChecks are issue 39's lines for refusals.
var refusalChecks = []check{
	{"issue 39", "Refusal (a draining engine, idemhttp.Handler, over loopback HTTP): server process CPU per refused request vs a bare net/http 503 with Retry-After",
		"≤ 1.5× bare", "refusals", read(figRefusalServer), atMost(1.5)},
	{"issue 39", "Refusal: server + client CPU per refused request vs the bare 503", "≤ 1.5× bare", "refusals", read(figRefusalTotal), atMost(1.5)},
	{"issue 39", "Refusal (an overloaded engine: MaxInFlight taken, AdmitWait 4ms; idemhttp.Handler, over loopback HTTP): server process CPU per refused request vs the bare 503",
		"≤ 1.5× bare", "refusals", read(figRefusalOverServer), atMost(1.5)},
	{"issue 39", "Refusal (overloaded): server + client CPU per refused request vs the bare 503", "≤ 1.5× bare", "refusals", read(figRefusalOverTotal), atMost(1.5)},
}

// refuserStats is what the refuser's stats route answers: its own CPU and heap
// allocations so far.
type refuserStats struct {
	CPU    time.Duration `json:"cpu_ns"`
	Allocs uint64        `json:"allocs"`
}

// runRefuser is the refusals part's server process: it serves the routes on a loopback
// port, prints the address, and serves until stdin closes.
func runRefuser(args []string) error {
	fs := flag.NewFlagSet(refuserCommand, flag.ContinueOnError)
	db := childDBFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	pool, err := db.pool(ctx, appLive, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	eng, err := workflow.New(pool, &workflow.Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		return err
	}
	// The provider is never called: every attempt is refused before its claim.
	if err := eng.Register(chargeflow.Flow(&chargeflow.ProviderClient{BaseURL: "http://127.0.0.1:9", HTTP: http.DefaultClient})); err != nil {
		return err
	}
	if err := eng.Drain(ctx); err != nil {
		return err
	}
	hcfg := &idemhttp.Config{Scope: func(r *http.Request) (string, error) { return r.Header.Get(refusalScope), nil }}
	h, err := idemhttp.Handler(eng, chargeflow.FlowName, hcfg)
	if err != nil {
		return err
	}
	over, err := overloadedEngine(ctx, pool)
	if err != nil {
		return err
	}
	oh, err := idemhttp.Handler(over, chargeflow.FlowName, hcfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+refusalIdemPath, h)
	mux.Handle("POST "+refusalOverPath, oh)
	mux.HandleFunc("POST "+refusalBarePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	handleChildStats(mux, func() refuserStats { return refuserStats{CPU: cpumeter.Self(), Allocs: heapAllocs()} })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	if err := serveChild(srv); err != nil {
		return err
	}
	return srv.Close()
}

// holdFlow is the flow whose one attempt holds the overloaded engine's only place:
// its first phase, a call phase, returns when the process exits (a flow needs a tx
// phase, so one follows, never reached; no transaction is held open).
const holdFlow = "bench_hold"

// overloadedEngine is an engine on pool whose only place in flight (MaxInFlight 1) is
// held by an attempt that never ends, with AdmitWait 4ms: it refuses every other
// attempt, for overload. The charges flow is registered on it.
func overloadedEngine(ctx context.Context, pool *pgxpool.Pool) (*workflow.Engine, error) {
	eng, err := workflow.New(pool, &workflow.Config{MaxInFlight: 1, AdmitWait: 4 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		return nil, err
	}
	if err := eng.Register(chargeflow.Flow(&chargeflow.ProviderClient{BaseURL: "http://127.0.0.1:9", HTTP: http.DefaultClient})); err != nil {
		return nil, err
	}
	entered := make(chan struct{})
	var once sync.Once
	hold := phases.Flow{Name: holdFlow, Phases: []phases.Phase{phases.Call("hold", func(context.Context, *phases.Run) (*phases.Response, error) {
		once.Do(func() { close(entered) })
		select {} // until the process exits
	}), phases.Tx("never", func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) {
		return nil, errors.New("unreachable: the call phase before never returns")
	})}}
	if err := eng.Register(hold); err != nil {
		return nil, err
	}
	failed := make(chan error, 1)
	go func() {
		req := workflow.Request{Scope: "acct_refusals_hold", Key: "hold-" + randomHex(8), Flow: holdFlow, Method: http.MethodPost, Route: "/hold"}
		for {
			_, err := eng.Do(context.Background(), req)
			if !errors.As(err, new(*workflow.ShedError)) { // the pool was slow to connect
				failed <- fmt.Errorf("the attempt holding the overloaded engine's place ended: %v", err)
				return
			}
		}
	}()
	select {
	case <-entered:
		return eng, nil
	case err := <-failed:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refusalSide is one side's figures in one round, per request.
type refusalSide struct {
	N            int
	ServerUS     float64 // µs of the server process's CPU
	ClientUS     float64 // µs of this process's CPU
	ServerAllocs float64
	ClientAllocs float64
	Bytes        float64 // answer body bytes
}

// refusalRound is one interleaved round.
type refusalRound struct {
	Idem, Over, Bare refusalSide
}

// refusals runs the refusals part and hands its figures to the budget.
func (e *env) refusals(ctx context.Context) error {
	o := e.o
	kid, err := e.startChild(ctx, "the refusals server process", nil, refuserCommand)
	if err != nil {
		return err
	}
	defer kid.stop()
	base, err := kid.baseURL()
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.refusalConc, MaxConnsPerHost: o.refusalConc}}
	defer client.CloseIdleConnections()

	// Warm both sides (connections, code paths), then the rounds.
	for _, path := range []string{refusalIdemPath, refusalOverPath, refusalBarePath} {
		if _, err := e.refusalLoad(ctx, client, base, path, min(o.refusalN, 500)); err != nil {
			return err
		}
	}
	var rounds []refusalRound
	for r := range o.rounds {
		var rd refusalRound
		sides := []struct {
			path string
			to   *refusalSide
		}{{refusalIdemPath, &rd.Idem}, {refusalOverPath, &rd.Over}, {refusalBarePath, &rd.Bare}}
		for range r % len(sides) { // each side goes first in turn
			sides = append(sides[1:], sides[0])
		}
		for _, s := range sides {
			side, err := e.refusalLoad(ctx, client, base, s.path, o.refusalN)
			if err != nil {
				return err
			}
			*s.to = side
		}
		logf("refusals round %d: idemhttp draining %.1f µs server + %.1f µs client, %.1f + %.1f allocs; overloaded %.1f µs + %.1f µs, %.1f + %.1f allocs; bare %.1f µs + %.1f µs, %.1f + %.1f allocs (per request, N=%d, concurrency %d; load %s)",
			r+1, rd.Idem.ServerUS, rd.Idem.ClientUS, rd.Idem.ServerAllocs, rd.Idem.ClientAllocs,
			rd.Over.ServerUS, rd.Over.ClientUS, rd.Over.ServerAllocs, rd.Over.ClientAllocs,
			rd.Bare.ServerUS, rd.Bare.ClientUS, rd.Bare.ServerAllocs, rd.Bare.ClientAllocs, o.refusalN, o.refusalConc, loadAverage())
		rounds = append(rounds, rd)
	}
	e.setRefusalFigures(rounds)
	return nil
}

// setRefusalFigures hands the rounds' ratios to the budget: the draining engine's and
// the overloaded engine's, each against the bare 503 of the same round.
func (e *env) setRefusalFigures(rounds []refusalRound) {
	ctx := fmt.Sprintf("%d interleaved rounds of %d requests per side at concurrency %d; load average %s",
		len(rounds), e.o.refusalN, e.o.refusalConc, loadAverage())
	e.setRefusalSide(rounds, func(rd refusalRound) refusalSide { return rd.Idem }, figRefusalServer, figRefusalTotal, ctx)
	e.setRefusalSide(rounds, func(rd refusalRound) refusalSide { return rd.Over }, figRefusalOverServer, figRefusalOverTotal, ctx)
}

// setRefusalSide sets the figures serverID and totalID of the side side picks.
func (e *env) setRefusalSide(rounds []refusalRound, side func(refusalRound) refusalSide, serverID, totalID, ctx string) {
	var srv, tot []float64
	var idem, bare []refusalSide
	for _, rd := range rounds {
		s := side(rd)
		srv = append(srv, s.ServerUS/rd.Bare.ServerUS)
		tot = append(tot, (s.ServerUS+s.ClientUS)/(rd.Bare.ServerUS+rd.Bare.ClientUS))
		idem, bare = append(idem, s), append(bare, rd.Bare)
	}
	med := func(sides []refusalSide, f func(refusalSide) float64) float64 {
		var xs []float64
		for _, s := range sides {
			xs = append(xs, f(s))
		}
		return median(xs)
	}
	server := func(s refusalSide) float64 { return s.ServerUS }
	cl := func(s refusalSide) float64 { return s.ClientUS }
	sAllocs := func(s refusalSide) float64 { return s.ServerAllocs }
	cAllocs := func(s refusalSide) float64 { return s.ClientAllocs }
	e.figs.set(serverID, median(srv), fmt.Sprintf("%.1f µs vs %.1f µs = %.2f× (rounds: %.2f–%.2f×); server allocations %.1f vs %.1f per request; %s",
		med(idem, server), med(bare, server), median(srv), slices.Min(srv), slices.Max(srv), med(idem, sAllocs), med(bare, sAllocs), ctx))
	e.figs.set(totalID, median(tot), fmt.Sprintf("%.1f + %.1f µs vs %.1f + %.1f µs = %.2f× (rounds: %.2f–%.2f×); client allocations %.1f vs %.1f per request",
		med(idem, server), med(idem, cl), med(bare, server), med(bare, cl), median(tot), slices.Min(tot), slices.Max(tot), med(idem, cAllocs), med(bare, cAllocs)))
}

// loadAverage is /proc/loadavg's first three fields, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return "unknown"
	}
	return string(bytes.Join(f[:3], []byte(" ")))
}

// refusalLoad sends n keyed charge requests to path in refusalConc closed loops and
// returns the costs per request. Every answer must be a 503 with Retry-After: 1.
func (e *env) refusalLoad(ctx context.Context, client *http.Client, base, path string, n int) (refusalSide, error) {
	before, err := refuserRead(ctx, client, base)
	if err != nil {
		return refusalSide{}, err
	}
	cpu0, allocs0 := cpumeter.Self(), heapAllocs()
	var next, bodyBytes atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	prefix := fmt.Sprintf("refusal-%s-%d-", e.runID, time.Now().UnixNano())
	for range e.o.refusalConc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) || ctx.Err() != nil {
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(chargeBody))
				if err != nil {
					fail(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(refusalScope, "acct_refusals")
				req.Header.Set(idemhttp.KeyHeader, prefix+strconv.FormatInt(i, 10))
				resp, err := client.Do(req)
				if err != nil {
					fail(err)
					return
				}
				k, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				bodyBytes.Add(k)
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
					fail(fmt.Errorf("refusals: %s answered %d with Retry-After %q (%v), want 503 with Retry-After 1",
						path, resp.StatusCode, resp.Header.Get("Retry-After"), err))
					return
				}
			}
		})
	}
	wg.Wait()
	cpu1, allocs1 := cpumeter.Self(), heapAllocs()
	after, err := refuserRead(ctx, client, base)
	if err != nil {
		return refusalSide{}, err
	}
	if first != nil {
		return refusalSide{}, first
	}
	per := func(x float64) float64 { return x / float64(n) }
	return refusalSide{N: n,
		ServerUS:     per(float64(after.CPU-before.CPU) / float64(time.Microsecond)),
		ClientUS:     per(float64(cpu1-cpu0) / float64(time.Microsecond)),
		ServerAllocs: per(float64(after.Allocs - before.Allocs)),
		ClientAllocs: per(float64(allocs1 - allocs0)),
		Bytes:        per(float64(bodyBytes.Load())),
	}, nil
}

// refuserRead reads the server process's CPU and allocations.
func refuserRead(ctx context.Context, client *http.Client, base string) (refuserStats, error) {
	return readChildStats[refuserStats](ctx, client, base, "refusals: read the server process's stats")
}
