package main

import (
	"context"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// vIdemPipe is idemflow with the charges example's pipelined phases
// (chargeflow.PipelinedFlow): each tx phase is one round trip with the engine's claim
// or fence, key row write and COMMIT. It runs the library with its default Config.
const vIdemPipe = "idemflow-pipelined"

func init() {
	laterVariants = append(laterVariants, (*env).pipelinedVariant)
	laterVariants = append(laterVariants, func(e *env, mk func(string) (*variant, error)) (*variant, error) {
		if !e.o.historyOmit {
			return nil, nil
		}
		return e.pipelinedVariantOf(mk, vIdemPipeOmit, true)
	})
}

// vIdemPipeOmit is idemflow-pipelined with Config.HistoryOmitCleanFinish (-history-omit-clean).
const vIdemPipeOmit = "idemflow-pipelined-omit"

// pipelinedVariant makes the idemflow-pipelined variant: a fast and a slow engine on a
// pool of its own, like idemflow's.
func (e *env) pipelinedVariant(mk func(name string) (*variant, error)) (*variant, error) {
	return e.pipelinedVariantOf(mk, vIdemPipe, false)
}

// pipelinedVariantOf is the variant name of the pipelined flow, its engines storing no
// history entry for a clean finish when omit is set (Config.HistoryOmitCleanFinish).
func (e *env) pipelinedVariantOf(mk func(name string) (*variant, error), name string, omit bool) (*variant, error) {
	v, err := mk(name)
	if err != nil {
		return nil, err
	}
	engine := func(url string, hooks workflow.Hooks) (*workflow.Engine, error) {
		eng, err := workflow.New(v.pool, &workflow.Config{Hooks: hooks, HistoryOmitCleanFinish: omit})
		if err != nil {
			return nil, err
		}
		return eng, eng.Register(chargeflow.PipelinedFlow(&chargeflow.ProviderClient{BaseURL: url, HTTP: e.httpClient}))
	}
	fast, err := engine(e.fast.URL, workflow.Hooks{})
	if err != nil {
		return nil, err
	}
	slow, err := engine(e.slow.URL, workflow.Hooks{
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
		return nil, err
	}
	v.fast = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, fast, e.replay, w) }
	v.slow = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, slow, e.replay, w) }
	return v, nil
}
