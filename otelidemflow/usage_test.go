package otelidemflow_test

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/workflow"
)

// usage holds the package documentation's snippet, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, pool workflow.Pool, tp trace.TracerProvider, mp metric.MeterProvider, myHooks workflow.Hooks) error {
	obs, err := otelidemflow.New(&otelidemflow.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return err
	}
	engine, err := workflow.New(pool, &workflow.Config{Hooks: workflow.JoinHooks(obs.Hooks(), myHooks)})
	if err != nil {
		return err
	}
	reg, err := obs.ObserveKeys(engine) // the gauges; reg.Unregister() stops them
	if err != nil {
		return err
	}
	err = engine.Start(ctx, &workflow.SweeperConfig{Hooks: obs.SweeperHooks()}) // the sweeper's liveness
	if err != nil {
		return err
	}
	return reg.Unregister()
}

var _ = usage
