package main

import (
	"context"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/workflow"
)

// Variants of -ops: the engine with no history written (Config.History -1), and with
// the OpenTelemetry adapter's hooks on an SDK tracer and meter that export nothing.
const (
	vIdemNoHistory = "idemflow-nohistory"
	vIdemOtel      = "idemflow-otel"
)

// opsVariants adds the variants of -ops: the charges flow through an engine that
// writes no history, and through one observed by otelidemflow (every span sampled and
// ended, every instrument aggregated by a reader nobody collects: the cost of the
// adapter, not of an exporter). The idemflow variant itself writes the history, as by
// default.
func (e *env) opsVariants(mk func(string) (*variant, error)) error {
	noHist, err := mk(vIdemNoHistory)
	if err != nil {
		return err
	}
	engine, err := e.engineWith(noHist, &workflow.Config{History: -1})
	if err != nil {
		return err
	}
	noHist.fast = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, engine, e.replay, w) }
	noHist.slow = noHist.fast

	observed, err := mk(vIdemOtel)
	if err != nil {
		return err
	}
	obs, err := otelidemflow.New(&otelidemflow.Config{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())),
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
	})
	if err != nil {
		return err
	}
	oe, err := e.engineWith(observed, &workflow.Config{Hooks: obs.Hooks()})
	if err != nil {
		return err
	}
	observed.fast = func(ctx context.Context, w *worker) error { return doIdemflow(ctx, oe, e.replay, w) }
	observed.slow = observed.fast
	e.variants = append(e.variants, noHist, observed)
	return nil
}

// engineWith is an engine of cfg with the charges flow on v's pool and the fast
// provider.
func (e *env) engineWith(v *variant, cfg *workflow.Config) (*workflow.Engine, error) {
	eng, err := workflow.New(v.pool, cfg)
	if err != nil {
		return nil, err
	}
	client := &chargeflow.ProviderClient{BaseURL: e.fast.URL, HTTP: e.httpClient}
	if err := eng.Register(chargeflow.Flow(client)); err != nil {
		return nil, err
	}
	return eng, nil
}
