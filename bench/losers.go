package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/workflow"
)

// The losing path (-phases losers): what a copy of a key that another attempt holds
// costs the client's connection pool, measured two ways.
//
//   - Round trips per pgx exec mode, on a pool of one connection (so that each request
//     finds what the one before it left on the connection): a fresh request on a new
//     connection (cold statement cache), fresh requests after it (warm), a loser (its
//     key's claim lock held by another connection), and the fresh request right after
//     the loser on the same connection. A loser whose claim raises inside a pgx batch
//     (recipe-fused-safe, and the pipelined phase of issue 26) makes pgx invalidate every
//     statement of that batch in its caches: the next request on the connection pays a
//     Deallocate and a Prepare. A loser whose batch began a transaction with BEGIN is
//     left in an aborted transaction and must send ROLLBACK before the pool takes the
//     connection back (pgxpool destroys a connection released inside a transaction).
//     Round trips are counted on the socket (writes after a read), so prepares,
//     deallocates and rollbacks count.
//   - Fresh requests on a pool while copies of a held key lose on the same pool: fresh
//     requests at concurrency 8, and every 10 ms a burst of K copies of one held key,
//     against the same fresh load without copies, in interleaved cells.

// loserFreshConc is the fresh requests' concurrency in the contention run; the gap
// between bursts of copies is -loser-gap (50 ms by default).
const loserFreshConc = 8

// loserCopies are the copies per key of the contention run.
var loserCopies = []int{8, 16}

// execModes are pgx's exec modes, default first.
var execModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// loserRTs are the socket round trips of one variant in one exec mode.
type loserRTs struct {
	Variant, Mode                                   string
	FreshCold, FreshWarm, Loser, AfterLoser, Replay float64
	LoserBegin, AfterLoserBegin                     float64 // recipe-fused-safe with BEGIN in its claim batch
	Errors                                          []string
}

// loserCell is one cell of the contention run.
type loserCell struct {
	Variant     string
	Copies      int // 0: no copies
	Round       int
	Fresh       float64 // req/s
	P50, P99    time.Duration
	Losers      int // copies answered 409
	LoserErrs   int // copies answered otherwise
	Rollbacks   float64
	ServerCPU   float64 // ms per fresh request (all the server's work, copies' included)
	ClientCPU   float64
	AcquireWait int64 // acquisitions that waited for a connection
}

// loserResult is the experiment.
type loserResult struct {
	RTs   []loserRTs
	Cells []loserCell
}

// loserTarget is one variant seen by the experiment: a fresh request, a copy of a held
// key, a replay, and how to hold a key's claim lock from another connection.
type loserTarget struct {
	name   string
	fresh  func(ctx context.Context, w *worker) error
	loser  func(ctx context.Context, scope, key string) error
	replay func(ctx context.Context, w *worker) error // nil: none
	lockID func(scope, key string) int64
	lockOn string // the statement that takes the lock, $1 the id
}

// idemflowClaimHash is the engine's claim-lock hash of a key (store.claimHash: FNV-1a of
// "idemflow\x00", the scope, "\x00" and the key), copied so that the bench can hold a
// key's claim lock as an attempt inside its first transaction holds it.
func idemflowClaimHash(scope, key string) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, part := range [...]string{"idemflow\x00", scope, "\x00", key} {
		for i := 0; i < len(part); i++ {
			h ^= uint64(part[i])
			h *= prime
		}
	}
	return int64(h)
}

// loserTargets builds the variants on pool: recipe-fused-safe, idemflow and
// idemflow-pipelined.
func (e *env) loserTargets(pool *pgxpool.Pool) ([]loserTarget, error) {
	client := &chargeflow.ProviderClient{BaseURL: e.fast.URL, HTTP: e.httpClient}
	eng, err := e.engine(pool, e.fast.URL, workflow.Hooks{})
	if err != nil {
		return nil, err
	}
	ring := newKeyRing(1000)
	safe := loserTarget{
		name:  vSafe,
		fresh: func(ctx context.Context, w *worker) error { return doFusedSafe(ctx, pool, client, w) },
		loser: func(ctx context.Context, scope, key string) error {
			if err := fusedSafeKey(ctx, pool, client, scope, key); !errors.Is(err, errFusedInProgress) {
				return fmt.Errorf("copy of a held key answered %v, want in progress", err)
			}
			return nil
		},
		lockID: safeLockID,
		lockOn: "SELECT pg_advisory_lock($1::bigint)",
	}
	idem := engineLoserTarget(vIdem, eng, ring)
	pipe, err := e.pipelinedLoserTarget(pool, client)
	if err != nil {
		return nil, err
	}
	return []loserTarget{safe, idem, pipe}, nil
}

// pipelinedLoserTarget is idemflow-pipelined on pool: an engine with the library's
// default Config running chargeflow.PipelinedFlow, whose claim raises only for a loser.
func (e *env) pipelinedLoserTarget(pool *pgxpool.Pool, client *chargeflow.ProviderClient) (loserTarget, error) {
	eng, err := workflow.New(pool, &workflow.Config{})
	if err != nil {
		return loserTarget{}, err
	}
	if err := eng.Register(chargeflow.PipelinedFlow(client)); err != nil {
		return loserTarget{}, err
	}
	return engineLoserTarget(vIdemPipe, eng, newKeyRing(1000)), nil
}

// engineLoserTarget is the loser target of an idemflow engine: fresh requests, copies
// of a held key (each must be told 409 at once), and replays, on keys of ring.
func engineLoserTarget(name string, eng *workflow.Engine, ring *keyRing) loserTarget {
	return loserTarget{
		name:  name,
		fresh: func(ctx context.Context, w *worker) error { return doIdemflow(ctx, eng, ring, w) },
		loser: func(ctx context.Context, scope, key string) error {
			_, err := eng.Do(ctx, workflow.Request{Scope: scope, Key: key, Flow: chargeflow.FlowName,
				Method: "POST", Route: chargeRoute, Body: chargeBody})
			if dupKind(nil, err) != "409" {
				return fmt.Errorf("copy of a held key answered %v, want 409", err)
			}
			return nil
		},
		replay: func(ctx context.Context, w *worker) error { return doReplay(ctx, eng, ring, w) },
		lockID: idemflowClaimHash,
		lockOn: "SELECT pg_advisory_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)",
	}
}

// holdKey takes the claim lock of (scope, key) on a connection of the check pool and
// returns the function that lets it go.
func (e *env) holdKey(ctx context.Context, t loserTarget, scope, key string) (func(), error) {
	c, err := e.check.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, t.lockOn, t.lockID(scope, key)); err != nil {
		c.Release()
		return nil, fmt.Errorf("hold the key: %w", err)
	}
	return func() {
		_, _ = c.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_all()")
		c.Release()
	}, nil
}

// losers runs both parts of the experiment.
func (e *env) losers(ctx context.Context) (*loserResult, error) {
	res := &loserResult{}
	for _, mode := range execModes {
		rts, err := e.loserModeRTs(ctx, mode)
		if err != nil {
			return nil, err
		}
		res.RTs = append(res.RTs, rts...)
	}
	cells, err := e.loserContention(ctx)
	res.Cells = cells
	return res, err
}

// loserModeRTs measures each target's round trips on a pool of one connection in mode.
func (e *env) loserModeRTs(ctx context.Context, mode pgx.QueryExecMode) ([]loserRTs, error) {
	cfg, err := poolConfig(e.db.serverURL, e.db.name, e.db.schema, appLive, 1)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	tr := &tracer{}
	tr.install(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	targets, err := e.loserTargets(pool)
	if err != nil {
		return nil, err
	}
	var out []loserRTs
	for _, t := range targets {
		r := loserRTs{Variant: t.name, Mode: mode.String()}
		w := &worker{id: 1, e: e, rng: rand.New(rand.NewPCG(1, 2))}
		wire := func(fn func() error) float64 {
			before := tr.snapshot().Wire
			if err := fn(); err != nil {
				r.Errors = append(r.Errors, err.Error())
			}
			return float64(tr.snapshot().Wire - before)
		}
		fresh := func() error { return t.fresh(ctx, w) }
		// A new connection for each target: its statement cache starts empty.
		pool.Reset()
		r.FreshCold = wire(fresh)
		const warm = 5
		for range warm {
			r.FreshWarm += wire(fresh) / warm
		}
		scope, key := w.scope(), w.key()
		release, err := e.holdKey(ctx, t, scope, key)
		if err != nil {
			return nil, err
		}
		r.Loser = wire(func() error { return t.loser(ctx, scope, key) })
		r.AfterLoser = wire(fresh)
		if t.name == vSafe {
			r.LoserBegin = wire(func() error { return fusedSafeKeyBegin(ctx, pool, scope, key) })
			r.AfterLoserBegin = wire(fresh)
		}
		release()
		if t.replay != nil {
			r.Replay = wire(func() error { return t.replay(ctx, w) })
		}
		out = append(out, r)
		logf("losers: %-18s %-16s fresh %.0f cold / %.1f warm; loser %.0f; fresh after it %.0f; replay %.0f; loser with BEGIN %.0f, fresh after it %.0f; errors %d",
			t.name, r.Mode, r.FreshCold, r.FreshWarm, r.Loser, r.AfterLoser, r.Replay, r.LoserBegin, r.AfterLoserBegin, len(r.Errors))
	}
	return out, nil
}

// fusedSafeKeyBegin is recipe-fused-safe's claim batch inside an explicit transaction
// (BEGIN … COMMIT in the batch, as an engine that opens a transaction would send it),
// sent for a held key: the claim raises, the connection is left in an aborted
// transaction, and ROLLBACK is sent before the connection goes back to the pool.
func fusedSafeKeyBegin(ctx context.Context, pool *pgxpool.Pool, scope, key string) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlSafeClaimLock, safeLockID(scope, key))
	b.Queue(sqlSafeClaim, scope, key, chargeRoute, chargeBody, "ch_"+randomHex(16), fusedLease.Milliseconds())
	b.Queue("COMMIT")
	err = c.SendBatch(ctx, b).Close()
	if !safeLost(err) {
		return fmt.Errorf("claim with BEGIN of a held key: %v, want the claim lost", err)
	}
	if c.Conn().PgConn().TxStatus() != 'I' {
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			return err
		}
	}
	return nil
}

// loserContention runs fresh requests with and without bursts of copies, per target.
func (e *env) loserContention(ctx context.Context) ([]loserCell, error) {
	cfg, err := poolConfig(e.db.serverURL, e.db.name, e.db.schema, appLive, 32)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	targets, err := e.loserTargets(pool)
	if err != nil {
		return nil, err
	}
	for _, t := range targets {
		if l := e.runLoad(ctx, t.fresh, 32, e.o.warmup, nil); l.errs > 0 {
			return nil, fmt.Errorf("losers warm-up %s: %w", t.name, l.firstErr)
		}
	}
	var out []loserCell
	scenarios := append([]int{0}, loserCopies...)
	for r := range e.o.rounds {
		for ti, t := range rotate(targets, r) {
			for _, k := range rotate(scenarios, r+ti) {
				c, err := e.loserCell(ctx, pool, t, k)
				if err != nil {
					return out, err
				}
				c.Round = r
				out = append(out, c)
				logf("losers round %d/%d %-18s copies %2d: fresh %6.0f req/s p50 %6.2f ms p99 %6.2f ms; %d copies lost (%d otherwise), %.2f rollbacks per fresh request",
					r+1, e.o.rounds, t.name, k, c.Fresh, ms(c.P50), ms(c.P99), c.Losers, c.LoserErrs, c.Rollbacks)
			}
		}
	}
	return out, nil
}

// loserCell runs fresh requests for a cell while bursts of copies copies of a held key
// lose on the same pool.
func (e *env) loserCell(ctx context.Context, pool *pgxpool.Pool, t loserTarget, copies int) (loserCell, error) {
	c := loserCell{Variant: t.name, Copies: copies}
	scope, key := "acct_losers", e.runID+"-held-"+randomHex(4)
	release, err := e.holdKey(ctx, t, scope, key)
	if err != nil {
		return c, err
	}
	defer release()
	if _, err := flush(ctx, pool); err != nil {
		return c, err
	}
	s0, err := e.snapshot(ctx)
	if err != nil {
		return c, err
	}
	waits0 := pool.Stat().EmptyAcquireCount()
	cpu0 := e.readCPU(false)
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	if copies > 0 {
		wg.Go(func() {
			tick := time.NewTicker(e.o.loserGap)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				for range copies {
					wg.Go(func() {
						err := t.loser(ctx, scope, key)
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							c.LoserErrs++
						} else {
							c.Losers++
						}
					})
				}
			}
		})
	}
	timer := time.AfterFunc(e.o.cell, func() { close(stop) })
	defer timer.Stop()
	l := e.runLoadUntil(ctx, t.fresh, loserFreshConc, stop, nil)
	wg.Wait()
	cpu1 := e.readCPU(true)
	if l.errs > 0 {
		return c, fmt.Errorf("losers: %s fresh requests with %d copies: %d failed; the first: %w", t.name, copies, l.errs, l.firstErr)
	}
	if _, err := flush(ctx, pool); err != nil {
		return c, err
	}
	s1, err := e.snapshot(ctx)
	if err != nil {
		return c, err
	}
	n := float64(max(l.n, 1))
	c.Fresh = float64(l.n) / l.elapsed.Seconds()
	c.P50, c.P99 = quantile(l.lats, 0.5), quantile(l.lats, 0.99)
	c.Rollbacks = float64(s1.rollbacks-s0.rollbacks) / n
	c.ServerCPU, c.ClientCPU = ms(cpu1.Server-cpu0.Server)/n, ms(cpu1.Client-cpu0.Client)/n
	c.AcquireWait = pool.Stat().EmptyAcquireCount() - waits0
	return c, nil
}

// violations: every copy must have lost with 409, every round trip count be read
// without an error.
func (r *loserResult) violations() []string {
	var out []string
	for _, x := range r.RTs {
		for _, err := range x.Errors {
			out = append(out, fmt.Sprintf("losers: %s in %s: %s", x.Variant, x.Mode, err))
		}
	}
	for _, c := range r.Cells {
		if c.LoserErrs > 0 {
			out = append(out, fmt.Sprintf("losers: %s with %d copies: %d copies did not answer 409", c.Variant, c.Copies, c.LoserErrs))
		}
	}
	return out
}

// loserRatio is the median over rounds of fresh req/s with copies ÷ without, and the
// range.
func (r *loserResult) loserRatio(variant string, copies int) (med, lo, hi float64, ok bool) {
	base := map[int]float64{}
	for _, c := range r.Cells {
		if c.Variant == variant && c.Copies == 0 {
			base[c.Round] = c.Fresh
		}
	}
	var xs []float64
	for _, c := range r.Cells {
		if b := base[c.Round]; c.Variant == variant && c.Copies == copies && b > 0 {
			xs = append(xs, c.Fresh/b)
		}
	}
	if len(xs) == 0 {
		return 0, 0, 0, false
	}
	return median(xs), slices.Min(xs), slices.Max(xs), true
}

// loserSection writes the experiment's tables.
func (r *report) loserSection(b *strings.Builder) {
	x := r.losers
	if x == nil {
		return
	}
	p := printer(b)
	p("\n## The losing path: round trips per pgx exec mode, and fresh requests beside losing copies\n\n")
	p("Round trips counted on the socket (a write after a read starts one: prepares, deallocates and rollbacks count), on a pool of one connection, so that each request finds what the request before it left on that connection. ")
	p("*cold*: the first request on a new connection (empty statement cache); *warm*: the mean of the five after it; *loser*: a copy of a key whose claim lock another connection holds; *after*: the fresh request right after the loser, on the same connection. ")
	p("recipe-fused-safe's loser raises inside its claim batch (pgx then invalidates the batch's statements: the next request deallocates and prepares them again); *loser with BEGIN* is the same claim batch inside BEGIN … COMMIT, which leaves the connection in an aborted transaction until a ROLLBACK.\n\n")
	p("| variant | exec mode | fresh cold | fresh warm | loser | fresh after the loser | replay | loser with BEGIN (+ ROLLBACK) | fresh after it |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range x.RTs {
		dash := func(v float64, has bool) string {
			if !has {
				return "—"
			}
			return fmt.Sprintf("%.0f", v)
		}
		p("| %s | %s | %.0f | %.1f | %.0f | %.0f | %s | %s | %s |\n", t.Variant, t.Mode, t.FreshCold, t.FreshWarm, t.Loser, t.AfterLoser,
			dash(t.Replay, t.Variant != vSafe), dash(t.LoserBegin, t.Variant == vSafe), dash(t.AfterLoserBegin, t.Variant == vSafe))
	}
	p("\nFresh requests at concurrency %d on a pool of 32 connections (default exec mode), alone and while every %s (`-loser-gap`) a burst of *copies* copies of one held key is sent on the same pool; cells of %s, interleaved, %d round(s). ", loserFreshConc, r.opts.loserGap, r.opts.cell, r.opts.rounds)
	p("CPU per fresh request includes the copies' work. Rollbacks are pg_stat_database's xact_rollback per fresh request (an implicit transaction that fails counts as one).\n\n")
	p("| variant | copies per key | round | fresh req/s | p50 (ms) | p99 (ms) | copies answered 409 | rollbacks per fresh request | CPU ms server / client per fresh request | acquisitions that waited |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range x.Cells {
		p("| %s | %d | %d | %.0f | %.2f | %.2f | %d | %.2f | %.2f / %.2f | %d |\n", c.Variant, c.Copies, c.Round+1, c.Fresh, ms(c.P50), ms(c.P99),
			c.Losers, c.Rollbacks, c.ServerCPU, c.ClientCPU, c.AcquireWait)
	}
}
