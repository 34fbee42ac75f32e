package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// The concurrent-duplicates experiment. A flow of the bench's own has one tx phase
// that takes o.dupSleep (SELECT pg_sleep) and then inserts a row. Its first attempt is
// started; once it is inside the phase (the phase function signals after its first
// statement, which opens the transaction), eight duplicates with the same key are sent
// at once, and with them unrelated charges requests of another scope, all through one
// engine on a pool sized like production's. The duplicates should each get 409 at
// once, holding no connection while the owner works; the unrelated requests should
// not notice them. A baseline run of the same unrelated requests while a first attempt
// runs with no duplicates gives the latency to compare with.

const (
	dupFlow      = "bench_slow_first"
	dupPhase     = "slow_insert"
	dupCount     = 8
	dupPoolSize  = 4
	dupUnrelated = 5 // unrelated requests, one after another, in each scenario
)

// dupAnswer is what one duplicate got.
type dupAnswer struct {
	Kind    string // "409", "replay 201", "ran the flow", or "error: …"
	Latency time.Duration
}

// dupScenario is one first attempt with what ran beside it.
type dupScenario struct {
	Key         string
	Winner      time.Duration // the first attempt's latency
	Dups        []dupAnswer   // empty in the baseline
	Unrelated   []time.Duration
	Entries     int // times the phase function ran for the key
	Effects     int // rows the phase inserted for the key
	DupAcquires int // pool connections acquired by duplicates
	DupMaxHeld  int // most connections held by duplicates at once
	DupLongest  time.Duration
	// While the first attempt ran: acquisitions by duplicates, and the most they held at once.
	DupDuringAcq, DupDuringHeld int
	PoolWaits                   int64 // acquisitions that waited for a connection, all requests (pgxpool Stat)
}

// dupResult is the experiment.
type dupResult struct {
	Sleep    time.Duration
	PoolSize int
	Base     dupScenario
	With     dupScenario
}

// dupExperiment holds the experiment's flow state.
type dupExperiment struct {
	sleep time.Duration

	mu      sync.Mutex
	entered map[string]chan struct{} // closed when the key's phase is inside its transaction
	entries map[string]int
}

func (x *dupExperiment) phase(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	x.mu.Lock()
	x.entries[run.Key()]++
	first := x.entries[run.Key()] == 1
	ch := x.entered[run.Key()]
	x.mu.Unlock()
	// The first statement opens the transaction (and, where the engine sends the claim
	// with it, the claim): only then is the attempt "inside its first phase".
	if _, err := tx.Exec(ctx, "SELECT $1::int", 1); err != nil {
		return nil, err
	}
	if first && ch != nil {
		close(ch)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", x.sleep.Seconds()); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO bench_dup_effects (scope, idempotency_key) VALUES ($1, $2)", run.Scope(), run.Key()); err != nil {
		return nil, err
	}
	return phases.JSON(201, map[string]string{"key": run.Key()})
}

// dupTracer follows the pool connections that duplicates acquire.
type dupTracer struct {
	mu       sync.Mutex
	held     map[*pgx.Conn]time.Time
	acquires int
	maxHeld  int
	longest  time.Duration
	// While the first attempt runs.
	winnerRuns    bool
	duringAcq     int
	duringMaxHeld int
}

type dupTag struct{}

func (t *dupTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *dupTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *dupTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (t *dupTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err != nil || ctx.Value(dupTag{}) == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.acquires++
	t.held[d.Conn] = time.Now()
	t.maxHeld = max(t.maxHeld, len(t.held))
	if t.winnerRuns {
		t.duringAcq++
		t.duringMaxHeld = max(t.duringMaxHeld, len(t.held))
	}
}

// winner records whether the first attempt is still running.
func (t *dupTracer) winner(running bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.winnerRuns = running
}

func (t *dupTracer) TraceRelease(_ *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at, ok := t.held[d.Conn]; ok {
		t.longest = max(t.longest, time.Since(at))
		delete(t.held, d.Conn)
	}
}

func (t *dupTracer) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held, t.acquires, t.maxHeld, t.longest = map[*pgx.Conn]time.Time{}, 0, 0, 0
	t.winnerRuns, t.duringAcq, t.duringMaxHeld = true, 0, 0
}

// duplicates runs the experiment.
func (e *env) duplicates(ctx context.Context) (*dupResult, error) {
	res := &dupResult{Sleep: e.o.dupSleep, PoolSize: dupPoolSize}
	x := &dupExperiment{sleep: e.o.dupSleep, entered: map[string]chan struct{}{}, entries: map[string]int{}}
	tr := &dupTracer{held: map[*pgx.Conn]time.Time{}}
	cfg, err := poolConfig(e.db.serverURL, e.db.name, e.db.schema, appLive, dupPoolSize)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = tr // pgxpool takes its acquire and release hooks from the connection's tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	prov := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
	defer prov.Close()
	eng, err := e.engine(pool, prov.URL, workflow.Hooks{})
	if err != nil {
		return nil, err
	}
	if err := eng.Register(phases.Flow{Name: dupFlow, Phases: []phases.Phase{phases.Tx(dupPhase, x.phase)}}); err != nil {
		return nil, err
	}
	// Warm: every connection of the pool opened, statement caches filled.
	for i := range dupPoolSize * 2 {
		if _, err := eng.Do(ctx, growthRequest("dup_other", fmt.Sprintf("warm-%s-%d", e.runID, i))); err != nil {
			return nil, fmt.Errorf("duplicates: warm-up: %w", err)
		}
	}
	seq := 0
	unrelated := func(ctx context.Context) ([]time.Duration, error) {
		var lats []time.Duration
		for range dupUnrelated {
			seq++
			t0 := time.Now()
			r, err := eng.Do(ctx, growthRequest("dup_other", fmt.Sprintf("other-%s-%d", e.runID, seq)))
			if err != nil {
				return lats, fmt.Errorf("duplicates: unrelated request: %w", err)
			}
			if r.Replayed || r.Response.Status != 201 {
				return lats, fmt.Errorf("%w: duplicates: unrelated fresh request answered %d (replayed %t)", errInvariant, r.Response.Status, r.Replayed)
			}
			lats = append(lats, time.Since(t0))
		}
		return lats, nil
	}
	for _, withDups := range []bool{false, true} {
		sc, err := e.dupScenario(ctx, eng, pool, x, tr, withDups, unrelated)
		if err != nil {
			return nil, err
		}
		if withDups {
			res.With = sc
		} else {
			res.Base = sc
		}
	}
	return res, nil
}

// dupScenario starts a first attempt, waits until it is inside its phase, then runs the
// unrelated requests (and, withDups, the duplicates at the same moment) and waits for
// everything to end.
func (e *env) dupScenario(ctx context.Context, eng *workflow.Engine, pool *pgxpool.Pool, x *dupExperiment, tr *dupTracer,
	withDups bool, unrelated func(context.Context) ([]time.Duration, error)) (dupScenario, error) {
	sc := dupScenario{Key: fmt.Sprintf("slow-%s-%t", e.runID, withDups)}
	ctx, cancel := context.WithTimeout(ctx, 2*x.sleep+time.Minute)
	defer cancel()
	entered := make(chan struct{})
	x.mu.Lock()
	x.entered[sc.Key] = entered
	x.mu.Unlock()
	req := workflow.Request{Scope: "dup_slow", Key: sc.Key, Flow: dupFlow, Method: "POST", Route: "/v1/slow", Body: []byte(`{"n":1}`)}
	winnerDone := make(chan error, 1)
	t0 := time.Now()
	go func() {
		r, err := eng.Do(ctx, req)
		sc.Winner = time.Since(t0)
		tr.winner(false)
		if err == nil && (r.Replayed || r.Response.Status != 201) {
			err = fmt.Errorf("%w: first attempt answered %d (replayed %t)", errInvariant, r.Response.Status, r.Replayed)
		}
		winnerDone <- err
	}()
	select {
	case <-entered:
	case err := <-winnerDone:
		return sc, fmt.Errorf("duplicates: the first attempt ended before its phase began: %v", err)
	case <-ctx.Done():
		return sc, ctx.Err()
	}
	tr.reset()
	waits0 := pool.Stat().EmptyAcquireCount()
	start := make(chan struct{})
	var wg sync.WaitGroup
	if withDups {
		sc.Dups = make([]dupAnswer, dupCount)
		for i := range dupCount {
			wg.Go(func() {
				<-start
				dctx := context.WithValue(ctx, dupTag{}, i)
				t := time.Now()
				r, err := eng.Do(dctx, req)
				sc.Dups[i] = dupAnswer{Kind: dupKind(r, err), Latency: time.Since(t)}
			})
		}
	}
	var uerr error
	wg.Go(func() {
		<-start
		sc.Unrelated, uerr = unrelated(ctx)
	})
	close(start)
	wg.Wait()
	if err := <-winnerDone; err != nil {
		return sc, fmt.Errorf("duplicates: first attempt: %w", err)
	}
	if uerr != nil {
		return sc, uerr
	}
	sc.PoolWaits = pool.Stat().EmptyAcquireCount() - waits0
	tr.mu.Lock()
	sc.DupAcquires, sc.DupMaxHeld, sc.DupLongest = tr.acquires, tr.maxHeld, tr.longest
	sc.DupDuringAcq, sc.DupDuringHeld = tr.duringAcq, tr.duringMaxHeld
	tr.mu.Unlock()
	x.mu.Lock()
	sc.Entries = x.entries[sc.Key]
	x.mu.Unlock()
	if err := e.check.QueryRow(ctx, "SELECT count(*) FROM bench_dup_effects WHERE scope = 'dup_slow' AND idempotency_key = $1", sc.Key).Scan(&sc.Effects); err != nil {
		return sc, err
	}
	logf("duplicates: %s: first attempt %s; duplicates %s; unrelated %s; phase entered %d×, %d effect row(s)",
		map[bool]string{false: "baseline", true: "with duplicates"}[withDups], sc.Winner.Round(time.Millisecond),
		fmtAnswers(sc.Dups), fmtLats(sc.Unrelated), sc.Entries, sc.Effects)
	return sc, nil
}

func dupKind(r *workflow.Result, err error) string {
	var ip *workflow.InProgressError
	switch {
	case errors.As(err, &ip):
		return "409"
	case err != nil:
		msg := err.Error()
		if len(msg) > 80 {
			msg = msg[:77] + "..."
		}
		return "error: " + msg
	case r.Replayed:
		return "replay " + strconv.Itoa(r.Response.Status)
	}
	return "ran the flow"
}

func fmtAnswers(as []dupAnswer) string {
	if len(as) == 0 {
		return "none"
	}
	n := map[string]int{}
	var kinds []string
	var worst time.Duration
	for _, a := range as {
		if n[a.Kind] == 0 {
			kinds = append(kinds, a.Kind)
		}
		n[a.Kind]++
		worst = max(worst, a.Latency)
	}
	slices.Sort(kinds)
	var s []string
	for _, k := range kinds {
		s = append(s, fmt.Sprintf("%s ×%d", k, n[k]))
	}
	return fmt.Sprintf("%s, slowest %.1f ms", strings.Join(s, ", "), ms(worst))
}

func fmtLats(ls []time.Duration) string {
	var s []string
	for _, l := range ls {
		s = append(s, fmt.Sprintf("%.1f", ms(l)))
	}
	return strings.Join(s, ", ") + " ms"
}

func maxLat(ls []time.Duration) time.Duration {
	var m time.Duration
	for _, l := range ls {
		m = max(m, l)
	}
	return m
}

// dupFigure kinds: what each concurrent-duplicates line is judged on.
const (
	dupAnswers = iota // duplicates not answered 409 within 50 ms
	dupEntries        // runs of the phase function for the key
	dupHeld           // ms: the longest a duplicate held a pool connection
	dupSlowed         // ms: the slowest unrelated request with duplicates less without
)

// dupFigure is one of the experiment's figures for the budget.
func (r *report) dupFigure(kind int) figure {
	d := r.dups
	if d == nil {
		return figure{}
	}
	w := d.With
	switch kind {
	case dupAnswers:
		bad := dupCount - len(w.Dups)
		for _, a := range w.Dups {
			if a.Kind != "409" || a.Latency > 50*time.Millisecond {
				bad++
			}
		}
		return figure{ok: true, val: float64(bad), text: fmt.Sprintf("%s (first attempt: %.0f ms, its phase taking %s)", fmtAnswers(w.Dups), ms(w.Winner), d.Sleep)}
	case dupEntries:
		n := float64(w.Entries)
		return figure{ok: true, val: n, lo: n, hi: n, text: fmt.Sprintf("phase function ran %d× for the key", w.Entries)}
	case dupHeld:
		return figure{ok: true, val: ms(w.DupLongest),
			text: fmt.Sprintf("while the first attempt ran, duplicates acquired %d pool connections, up to %d of %d at once; in all %d, the longest held %.1f ms",
				w.DupDuringAcq, w.DupDuringHeld, d.PoolSize, w.DupAcquires, ms(w.DupLongest))}
	}
	base, with := maxLat(d.Base.Unrelated), maxLat(w.Unrelated)
	return figure{ok: true, val: ms(with - base),
		text: fmt.Sprintf("slowest %.1f ms with duplicates (%s) vs %.1f ms without (%s); %d acquisitions waited for a connection with duplicates, %d without (pool of %d)",
			ms(with), fmtLats(w.Unrelated), ms(base), fmtLats(d.Base.Unrelated), w.PoolWaits, d.Base.PoolWaits, d.PoolSize)}
}

// dupViolations are the experiment's invariant violations: an effect applied other
// than once.
func (d *dupResult) violations() []string {
	var out []string
	for _, sc := range []dupScenario{d.Base, d.With} {
		if sc.Effects != 1 {
			out = append(out, fmt.Sprintf("duplicates: key %s: the phase's effect committed %d times, want 1", sc.Key, sc.Effects))
		}
		for _, a := range sc.Dups {
			if a.Kind == "ran the flow" {
				out = append(out, fmt.Sprintf("duplicates: key %s: a duplicate ran the flow as a fresh attempt", sc.Key))
			}
		}
	}
	return out
}

// dupSection writes the experiment's section.
func (r *report) dupSection(b *strings.Builder) {
	d := r.dups
	if d == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Concurrent duplicates\n\n")
	p("A flow of the bench's own (`%s`: one tx phase that runs `SELECT pg_sleep(%.1f)` and inserts a row) runs through `workflow.Engine.Do` on a pool of %d connections, with the charges flow on the same engine. ", dupFlow, d.Sleep.Seconds(), d.PoolSize)
	p("Its first attempt is started; when its phase function has run its first statement (the transaction is open) it closes a channel, and at that signal %d duplicates with the same key and body are sent at once, together with %d unrelated charges requests of another scope, one after another. ", dupCount, dupUnrelated)
	p("The baseline is the same with no duplicates. Pool connections acquired by duplicates are followed exactly by a pgxpool acquire/release tracer.\n\n")
	p("| scenario | first attempt (ms) | duplicates' answers | duplicates' latencies (ms) | unrelated requests (ms) | phase function runs | effect rows | duplicates' connections while the first attempt ran (acquired / most at once) | in all (acquired / longest held ms) | acquisitions that waited |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range []struct {
		name string
		sc   dupScenario
	}{{"baseline", d.Base}, {"with duplicates", d.With}} {
		var dl []time.Duration
		for _, a := range s.sc.Dups {
			dl = append(dl, a.Latency)
		}
		dls := "—"
		if len(dl) > 0 {
			dls = fmtLats(dl)
		}
		p("| %s | %.0f | %s | %s | %s | %d | %d | %d / %d | %d / %.1f | %d |\n", s.name, ms(s.sc.Winner), fmtAnswers(s.sc.Dups), dls, fmtLats(s.sc.Unrelated),
			s.sc.Entries, s.sc.Effects, s.sc.DupDuringAcq, s.sc.DupDuringHeld, s.sc.DupAcquires, ms(s.sc.DupLongest), s.sc.PoolWaits)
	}
}
