package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// Variant names, in report order.
const (
	vBare    = "bare"
	vRecipe  = "recipe"
	vFused   = "recipe-fused"
	vSafe    = "recipe-fused-safe"
	vIdem    = "idemflow"
	vReplay  = "idemflow-replay"
	vControl = "control: tx held across the call"
)

// chargeBody is every request's body.
var chargeBody = []byte(`{"amount":1999,"currency":"usd","source":"tok_visa"}`)

const chargeRoute = "/v1/charges"

// doFunc runs one request.
type doFunc func(ctx context.Context, w *worker) error

// variant is one way of serving a charge, on a pool of its own.
type variant struct {
	name     string
	pool     *pgxpool.Pool
	ownsPool bool
	tr       *tracer
	fast     doFunc // provider latency 0
	slow     doFunc // provider latency o.slowLatency, tracked
}

// worker is one closed-loop client.
type worker struct {
	id  int
	rng *rand.Rand
	e   *env
}

func (w *worker) scope() string { return "acct_" + strconv.Itoa(w.id%16) }

func (w *worker) key() string { return w.e.runID + "-" + strconv.FormatInt(w.e.seq.next(), 10) }

type seqCounter struct{ n atomic.Int64 }

func (s *seqCounter) next() int64 { return s.n.Add(1) }

// keyRing holds finished idemflow keys for the replay variant.
type keyRing struct {
	mu   sync.Mutex
	keys [][2]string
	next int
}

func newKeyRing(size int) *keyRing { return &keyRing{keys: make([][2]string, 0, size)} }

func (r *keyRing) add(scope, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) < cap(r.keys) {
		r.keys = append(r.keys, [2]string{scope, key})
		return
	}
	r.keys[r.next] = [2]string{scope, key}
	r.next = (r.next + 1) % len(r.keys)
}

func (r *keyRing) pick(rng *rand.Rand) ([2]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) == 0 {
		return [2]string{}, false
	}
	return r.keys[rng.IntN(len(r.keys))], true
}

// laterVariants make variants that files of their own add to the rounds (an init
// function appends the constructor): the place for idemflow-pipelined, the charges flow
// with pipelined tx phases (issue 26). Each gets a pool from mk, sets its fast and
// slow functions, and runs in every round after the built-in variants; the report
// lists it after them, with × bare and CPU per request like the others.
var laterVariants []func(e *env, mk func(name string) (*variant, error)) (*variant, error)

// newVariants builds the variants, each on a pool of its own sized for the largest
// concurrency, and the slow run's negative control.
func (e *env) newVariants(ctx context.Context) error {
	maxConc := 0
	for _, c := range e.o.conc {
		maxConc = max(maxConc, c)
	}
	mk := func(name string) (*variant, error) {
		tr := &tracer{}
		if e.o.rtProfile {
			tr.prof = &rtProfile{}
		}
		pool, err := e.newPool(ctx, int32(maxConc), tr)
		if err != nil {
			return nil, err
		}
		return &variant{name: name, pool: pool, ownsPool: true, tr: tr}, nil
	}
	fastClient := &chargeflow.ProviderClient{BaseURL: e.fast.URL, HTTP: e.httpClient}
	slowClient := &chargeflow.ProviderClient{BaseURL: e.slow.URL, HTTP: e.httpClient}

	// The hand-written variants: each calls the provider with its own code.
	var hand []*variant
	for _, h := range []struct {
		name string
		do   func(context.Context, *pgxpool.Pool, *chargeflow.ProviderClient, *worker) error
	}{{vBare, doBare}, {vRecipe, doRecipe}, {vFused, doFused}, {vSafe, doFusedSafe}} {
		v, err := mk(h.name)
		if err != nil {
			return err
		}
		v.fast = func(ctx context.Context, w *worker) error { return h.do(ctx, v.pool, fastClient, w) }
		v.slow = func(ctx context.Context, w *worker) error { return h.do(ctx, v.pool, slowClient, w) }
		hand = append(hand, v)
	}
	bare := hand[0]
	idem, replay, err := e.engineVariants(mk)
	if err != nil {
		return err
	}

	// The control shares the bare pool: it runs only in the slow run, alone.
	e.control = &variant{name: vControl, pool: bare.pool, tr: bare.tr,
		slow: func(ctx context.Context, w *worker) error { return doHeldTx(ctx, bare.pool, slowClient, w) }}

	e.variants = append(hand, idem, replay)
	for _, later := range laterVariants {
		v, err := later(e, mk)
		if err != nil {
			return err
		}
		if v != nil { // nil: a variant its flag leaves out
			e.variants = append(e.variants, v)
		}
	}
	if e.o.ops {
		return e.opsVariants(mk)
	}
	return nil
}

// engineVariants makes the variants that run through idemflow's engine: fresh
// requests (a fast and a slow engine on one pool) and replays (on a pool of their own).
func (e *env) engineVariants(mk func(name string) (*variant, error)) (idem, replay *variant, err error) {
	idem, err = mk(vIdem)
	if err != nil {
		return nil, nil, err
	}
	fastEngine, err := e.engine(idem.pool, e.fast.URL, workflow.Hooks{})
	if err != nil {
		return nil, nil, err
	}
	// The slow engine reports its call phases to the tracker.
	slowEngine, err := e.engine(idem.pool, e.slow.URL, workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				callStart(ctx)
			}
			return ctx
		},
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if ev.Kind == phases.KindCall {
				callEnd(ctx)
			}
		},
	})
	if err != nil {
		return nil, nil, err
	}
	idem.fast = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, fastEngine, e.replay, w) }
	idem.slow = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, slowEngine, e.replay, w) }

	// Replays run on a pool of their own too, through an engine of their own: the
	// replay path is the same for any engine.
	replay, err = mk(vReplay)
	if err != nil {
		return nil, nil, err
	}
	replayEngine, err := e.engine(replay.pool, e.fast.URL, workflow.Hooks{})
	if err != nil {
		return nil, nil, err
	}
	replay.fast = func(ctx context.Context, w *worker) error { return doReplay(ctx, replayEngine, e.replay, w) }
	replay.slow = replay.fast
	return idem, replay, nil
}

const (
	sqlInsertCharge = `INSERT INTO charges (account_id, idempotency_key, amount, currency, source)
		VALUES ($1, $2, $3, $4, $5) RETURNING id`
	sqlMarkSucceeded = `UPDATE charges SET status = 'succeeded', provider_payment_id = $3
		WHERE id = $1 AND account_id = $2
		RETURNING id, amount, currency, source, status, provider_payment_id`
)

// doBare is the charges flow with no idempotency: two autocommit statements around
// the provider call, which gets the charge id as its key.
func doBare(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, w *worker) error {
	req, err := chargeflow.ParseRequest(chargeBody)
	if err != nil {
		return err
	}
	scope := w.scope()
	var id string
	if err := pool.QueryRow(ctx, sqlInsertCharge, scope, w.key(), req.Amount, req.Currency, req.Source).Scan(&id); err != nil {
		return fmt.Errorf("insert charge: %w", err)
	}
	callStart(ctx)
	pay, err := provider.Pay(ctx, "bare:"+id, req)
	callEnd(ctx)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	c, err := chargeflow.ScanCharge(pool.QueryRow(ctx, sqlMarkSucceeded, id, scope, pay))
	if err != nil {
		return fmt.Errorf("mark charge succeeded: %w", err)
	}
	_, err = json.Marshal(c)
	return err
}

// keyTableSchema is the textbook key table, named table: the recipe's, and the fused
// recipe's under another name.
func keyTableSchema(table string) string {
	return strings.Replace(recipeKeysDDL, "recipe_keys", table, 1)
}

const recipeKeysDDL = `
CREATE TABLE IF NOT EXISTS recipe_keys (
	id              bigserial   PRIMARY KEY,
	scope           text        NOT NULL,
	idempotency_key text        NOT NULL,
	request_method  text        NOT NULL,
	request_path    text        NOT NULL,
	request_body    bytea       NOT NULL,
	locked_at       timestamptz,
	recovery_point  text        NOT NULL DEFAULT 'started',
	charge_id       text,
	response_code   int,
	response_body   bytea,
	created_at      timestamptz NOT NULL DEFAULT now(),
	last_run_at     timestamptz NOT NULL DEFAULT now(),
	UNIQUE (scope, idempotency_key)
)`

var errRecipeExisting = errors.New("recipe: key exists (the bench sends fresh keys only)")

// doRecipe is the textbook recipe ("atomic phases" with a recovery point on a key
// row): the claim commits in a transaction of its own, then each phase's transaction
// advances the recovery point, fenced by locked_at; every statement, BEGIN and COMMIT
// included, is a round trip of its own. 11 round trips, 3 commits. Only the fresh-key
// path is exercised.
func doRecipe(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, w *worker) (err error) {
	req, err := chargeflow.ParseRequest(chargeBody)
	if err != nil {
		return err
	}
	scope, key := w.scope(), w.key()

	// The claim.
	var keyID int64
	var lockedAt time.Time
	err = inTx(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO recipe_keys (scope, idempotency_key, request_method, request_path, request_body, locked_at)
			VALUES ($1, $2, 'POST', $3, $4, now())
			ON CONFLICT (scope, idempotency_key) DO NOTHING
			RETURNING id, locked_at`, scope, key, chargeRoute, chargeBody).Scan(&keyID, &lockedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return errRecipeExisting
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}

	// Phase create_charge.
	var chargeID string
	err = inTx(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlInsertCharge, scope, key, req.Amount, req.Currency, req.Source).Scan(&chargeID); err != nil {
			return err
		}
		return fenced(tx.Exec(ctx, `UPDATE recipe_keys SET recovery_point = 'charge_created', charge_id = $3, last_run_at = now()
			WHERE id = $1 AND locked_at = $2`, keyID, lockedAt, chargeID))
	})
	if err != nil {
		return fmt.Errorf("create charge: %w", err)
	}

	// Phase provider_charge, outside any transaction.
	callStart(ctx)
	pay, err := provider.Pay(ctx, "recipe:"+strconv.FormatInt(keyID, 10), req)
	callEnd(ctx)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}

	// Phase finalize: record the outcome and the response.
	return inTx(ctx, pool, func(tx pgx.Tx) error {
		c, err := chargeflow.ScanCharge(tx.QueryRow(ctx, sqlMarkSucceeded, chargeID, scope, pay))
		if err != nil {
			return err
		}
		body, err := json.Marshal(c)
		if err != nil {
			return err
		}
		return fenced(tx.Exec(ctx, `UPDATE recipe_keys SET recovery_point = 'finished', response_code = 201,
			response_body = $3, locked_at = NULL, last_run_at = now()
			WHERE id = $1 AND locked_at = $2`, keyID, lockedAt, body))
	})
}

func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

func fenced(tag interface{ RowsAffected() int64 }, err error) error {
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return errors.New("recipe: the key's lock moved")
	}
	return nil
}

// doIdemflow runs a fresh key through the engine.
func doIdemflow(ctx context.Context, eng *workflow.Engine, ring *keyRing, w *worker) error {
	scope, key := w.scope(), w.key()
	res, err := eng.Do(ctx, workflow.Request{Scope: scope, Key: key, Flow: chargeflow.FlowName,
		Method: "POST", Route: chargeRoute, Body: chargeBody})
	if err != nil {
		return err
	}
	if res.Replayed || res.Response.Status != 201 {
		return fmt.Errorf("%w: fresh key %s answered %d (replayed %t)", errInvariant, key, res.Response.Status, res.Replayed)
	}
	ring.add(scope, key)
	return nil
}

// doReplay retries a key idemflow finished.
func doReplay(ctx context.Context, eng *workflow.Engine, ring *keyRing, w *worker) error {
	k, ok := ring.pick(w.rng)
	if !ok {
		return errors.New("no finished key to replay")
	}
	res, err := eng.Do(ctx, workflow.Request{Scope: k[0], Key: k[1], Flow: chargeflow.FlowName,
		Method: "POST", Route: chargeRoute, Body: chargeBody})
	if err != nil {
		return err
	}
	if !res.Replayed || res.Response.Status != 201 || len(res.Response.Body) == 0 {
		return fmt.Errorf("%w: retry of finished key %s answered %d (replayed %t)", errInvariant, k[1], res.Response.Status, res.Replayed)
	}
	return nil
}

// doHeldTx is what the engine must never do: a transaction open across the call. It
// is the negative control of the slow run's connection checks.
func doHeldTx(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, w *worker) error {
	req, err := chargeflow.ParseRequest(chargeBody)
	if err != nil {
		return err
	}
	scope := w.scope()
	return inTx(ctx, pool, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, sqlInsertCharge, scope, w.key(), req.Amount, req.Currency, req.Source).Scan(&id); err != nil {
			return err
		}
		callStart(ctx)
		pay, err := provider.Pay(ctx, "held:"+id, req)
		callEnd(ctx)
		if err != nil {
			return err
		}
		_, err = chargeflow.ScanCharge(tx.QueryRow(ctx, sqlMarkSucceeded, id, scope, pay))
		return err
	})
}

// callStart and callEnd tell the tracker, if the request is tracked, that it is in a
// call phase.
func callStart(ctx context.Context) {
	if rs := reqFrom(ctx); rs != nil {
		rs.k.callStart(rs)
	}
}

func callEnd(ctx context.Context) {
	if rs := reqFrom(ctx); rs != nil {
		rs.k.callEnd(rs)
	}
}
