package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/workflow"
)

// The losing path in the throughput rounds (issue 39 item 4): every request is a copy
// of a key whose claim another attempt holds, so it must be told 409 at once, running
// none of the flow. Each variant has heldKeys keys whose claim locks one connection of
// its own holds for the whole run (as an attempt inside its first transaction holds
// them) and whose rows never exist; a request picks one at random. Its cells have the
// columns of every other variant: CPU, WAL, round trips, statements and allocations
// per losing request, in the default exec mode, so that a loser's cost is measured
// where the fresh requests' and the replays' are, not only in the losers part.
const (
	vIdemLoser = "idemflow-loser"           // the charges flow with Go-code phases
	vPipeLoser = "idemflow-pipelined-loser" // the charges flow with pipelined phases
	heldKeys   = 64
)

func init() {
	laterVariants = append(laterVariants,
		func(e *env, mk func(string) (*variant, error)) (*variant, error) {
			return e.loserVariant(mk, vIdemLoser, func(v *variant) (*workflow.Engine, error) {
				return e.engine(v.pool, e.fast.URL, workflow.Hooks{})
			})
		},
		func(e *env, mk func(string) (*variant, error)) (*variant, error) {
			return e.loserVariant(mk, vPipeLoser, func(v *variant) (*workflow.Engine, error) {
				eng, err := workflow.New(v.pool, &workflow.Config{})
				if err != nil {
					return nil, err
				}
				return eng, eng.Register(chargeflow.PipelinedFlow(&chargeflow.ProviderClient{BaseURL: e.fast.URL, HTTP: e.httpClient}))
			})
		})
}

// loserVariant makes a variant of losing copies on an engine that newEngine builds on
// the variant's pool. The held locks go when the run ends (env.close).
func (e *env) loserVariant(mk func(string) (*variant, error), name string, newEngine func(*variant) (*workflow.Engine, error)) (*variant, error) {
	v, err := mk(name)
	if err != nil {
		return nil, err
	}
	eng, err := newEngine(v)
	if err != nil {
		return nil, err
	}
	const scope = "acct_losers"
	keys := make([]string, heldKeys)
	for i := range keys {
		keys[i] = e.runID + "-" + name + "-held-" + strconv.Itoa(i)
	}
	if err := e.holdKeys(context.Background(), scope, keys); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	v.fast = func(ctx context.Context, w *worker) error {
		key := keys[w.rng.IntN(len(keys))]
		res, err := eng.Do(ctx, workflow.Request{Scope: scope, Key: key, Flow: chargeflow.FlowName,
			Method: "POST", Route: chargeRoute, Body: chargeBody})
		if kind := dupKind(res, err); kind != "409" {
			return fmt.Errorf("%w: copy of held key %s answered %s, want 409", errInvariant, key, kind)
		}
		return nil
	}
	v.slow = v.fast
	return v, nil
}

// holdKeys takes the claim locks of keys in scope on one connection of a pool of its
// own, held until the run ends. Session locks, as the losers part's holdKey takes
// them: the engine's claim tries the same lock and finds it taken.
func (e *env) holdKeys(ctx context.Context, scope string, keys []string) error {
	pool, err := e.newPool(ctx, 1, nil)
	if err != nil {
		return err
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return err
	}
	for _, k := range keys {
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1::bigint # 'idemflow_keys'::regclass::oid::bigint)", idemflowClaimHash(scope, k)); err != nil {
			c.Release()
			pool.Close()
			return fmt.Errorf("hold the key: %w", err)
		}
	}
	e.onClose = append(e.onClose, func() { releaseHeld(c, pool) })
	return nil
}

// releaseHeld lets the held locks go with their connection.
func releaseHeld(c *pgxpool.Conn, pool *pgxpool.Pool) {
	c.Release()
	pool.Close()
}
