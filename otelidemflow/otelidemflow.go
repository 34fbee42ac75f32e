package otelidemflow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/idemflow/idemflow/otelidemflow"

// Attribute keys.
const (
	FlowKey          = attribute.Key("idemflow.flow")
	ExecutorKey      = attribute.Key("idemflow.executor")
	OutcomeKey       = attribute.Key("idemflow.outcome")
	AttemptKey       = attribute.Key("idemflow.attempt")
	KeyIDKey         = attribute.Key("idemflow.key.id")
	ScopeKey         = attribute.Key("idemflow.scope")
	IdempotencyKey   = attribute.Key("idemflow.key")
	PhaseKey         = attribute.Key("idemflow.phase")
	PhaseKindKey     = attribute.Key("idemflow.phase.kind")
	PhaseOutcomeKey  = attribute.Key("idemflow.phase.outcome")
	RecoveryPointKey = attribute.Key("idemflow.recovery_point")
	DerivedKeyKey    = attribute.Key("idemflow.derived_key")
	EventKey         = attribute.Key("idemflow.event")
	KeyStatusKey     = attribute.Key("idemflow.key.status")
)

// Config configures an Observer. A nil *Config means all defaults.
type Config struct {
	// TracerProvider makes the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// RecordKeys adds the scope and the client's idempotency key to spans
	// (idemflow.scope, idemflow.key). Off by default: both may identify a customer.
	// Metrics never carry them.
	RecordKeys bool
	// RecordDerivedKeys adds a call phase's derived key (the key it passes to the
	// remote service) to its span, as idemflow.derived_key. Off by default.
	RecordDerivedKeys bool
	// GaugeTimeout bounds the query behind the gauges at each collection. Defaults to
	// 5s.
	GaugeTimeout time.Duration
}

// Observer turns an engine's hooks into spans and metrics. It is safe for concurrent
// use; one Observer may serve several engines.
type Observer struct {
	cfg    Config
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TraceContext

	attempts        metric.Int64Counter
	attemptDuration metric.Float64Histogram
	phaseDuration   metric.Float64Histogram
	keyEvents       metric.Int64Counter
	keys            metric.Int64ObservableGauge
	oldestDue       metric.Float64ObservableGauge
	lastPass        metric.Float64ObservableGauge

	// passedAt is when the last sweeper pass completed (Unix nanoseconds), or when
	// SweeperHooks was first called before any did; 0 until then: no series.
	passedAt atomic.Int64
}

// New returns an Observer, with its instruments made on cfg.MeterProvider.
func New(cfg *Config) (*Observer, error) {
	o := &Observer{}
	if cfg != nil {
		o.cfg = *cfg
	}
	if o.cfg.TracerProvider == nil {
		o.cfg.TracerProvider = otel.GetTracerProvider()
	}
	if o.cfg.MeterProvider == nil {
		o.cfg.MeterProvider = otel.GetMeterProvider()
	}
	if o.cfg.GaugeTimeout <= 0 {
		o.cfg.GaugeTimeout = 5 * time.Second
	}
	o.tracer = o.cfg.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
	o.meter = o.cfg.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	seconds := metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
	var errs []error
	var err error
	o.attempts, err = o.meter.Int64Counter("idemflow.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts on idempotency keys, by flow, executor and outcome."))
	errs = append(errs, err)
	o.attemptDuration, err = o.meter.Float64Histogram("idemflow.attempt.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("Duration of attempts on idempotency keys."))
	errs = append(errs, err)
	o.phaseDuration, err = o.meter.Float64Histogram("idemflow.phase.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("Duration of phase runs, a tx phase's commit included."))
	errs = append(errs, err)
	o.keyEvents, err = o.meter.Int64Counter("idemflow.key.events", metric.WithUnit("{event}"),
		metric.WithDescription("Lifecycle events of idempotency keys: takeovers, dead letters, releases, ..."))
	errs = append(errs, err)
	o.keys, err = o.meter.Int64ObservableGauge("idemflow.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Unfinished idempotency keys by flow and status: in_progress (not stuck), stuck (due for a sweeper), dead (dead-lettered)."))
	errs = append(errs, err)
	o.oldestDue, err = o.meter.Float64ObservableGauge("idemflow.keys.oldest_due", metric.WithUnit("s"),
		metric.WithDescription("How long the stuck key that has waited longest has been due for a sweeper; 0 when none is stuck."))
	errs = append(errs, err)
	o.lastPass, err = o.meter.Float64ObservableGauge("idemflow.sweeper.last_pass", metric.WithUnit("s"),
		metric.WithDescription("When this process's sweeper last completed a pass without error, as Unix time; before its first, when it was started."),
		metric.WithFloat64Callback(func(_ context.Context, obs metric.Float64Observer) error {
			if at := o.passedAt.Load(); at != 0 {
				obs.Observe(float64(at) / float64(time.Second))
			}
			return nil
		}))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Hooks returns the hooks that feed the observer; join them with others with
// workflow.JoinHooks.
func (o *Observer) Hooks() workflow.Hooks {
	return workflow.Hooks{
		AttemptStart: o.attemptStart,
		AttemptEnd:   o.attemptEnd,
		PhaseStart:   o.phaseStart,
		PhaseEnd:     o.phaseEnd,
		Key:          o.keyEvent,
		Origin:       o.origin,
	}
}

// SweeperHooks returns the hooks that feed idemflow.sweeper.last_pass, the liveness of
// this process's sweeper: pass them as workflow.SweeperConfig.Hooks to workflow.Engine.Start
// (with other Pass hooks, call both from one). The gauge is the Unix time, in seconds,
// when a pass last completed without error, from workflow.Engine.Start's loop or
// workflow.Engine.Sweep; a pass that fails (its error is logged) does not move it.
// Until the first pass completes it reads the time SweeperHooks was first called, so
// that a sweeper that never completes a pass ages like one that stopped. A process
// that never calls SweeperHooks has no series. It carries no attribute: the process
// is told apart by the exporter's (a Prometheus scrape's instance label). If the
// process runs several sweepers on one Observer, it is the latest pass of any.
// deploy/prometheus's IdemflowSweeperStalled alerts when it falls behind.
func (o *Observer) SweeperHooks() workflow.SweeperHooks {
	o.passedAt.CompareAndSwap(0, time.Now().UnixNano())
	return workflow.SweeperHooks{Pass: o.pass}
}

// pass records a sweeper pass that completed.
func (o *Observer) pass(_ context.Context, _ workflow.SweepStats, err error) {
	if err == nil {
		o.passedAt.Store(time.Now().UnixNano())
	}
}

type ctxKey int

const (
	attemptCtx ctxKey = iota
	phaseCtx
)

// running is a span this package started, with its start.
type running struct {
	span  trace.Span
	start time.Time
}

func (o *Observer) attemptStart(ctx context.Context, ev workflow.AttemptEvent) context.Context {
	attrs := []attribute.KeyValue{ExecutorKey.String(string(ev.Executor))}
	if ev.Flow != "" {
		attrs = append(attrs, FlowKey.String(ev.Flow))
	}
	if ev.ID != "" {
		attrs = append(attrs, KeyIDKey.String(ev.ID), AttemptKey.Int(ev.Attempt))
	}
	if ev.RecoveryPoint != "" {
		attrs = append(attrs, RecoveryPointKey.String(ev.RecoveryPoint))
	}
	if o.cfg.RecordKeys {
		attrs = append(attrs, ScopeKey.String(ev.Scope), IdempotencyKey.String(ev.Key))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if l, ok := o.link(ev.Origin); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	ctx, span := o.tracer.Start(ctx, spanName("idemflow.attempt", ev.Flow), opts...)
	return context.WithValue(ctx, attemptCtx, &running{span: span, start: time.Now()})
}

func spanName(prefix, name string) string {
	if name == "" {
		return prefix
	}
	return prefix + " " + name
}

// link is the span link to the attempt that claimed a key, from its origin.
func (o *Observer) link(origin string) (trace.Link, bool) {
	if origin == "" {
		return trace.Link{}, false
	}
	ctx := o.prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": origin})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("idemflow.link", "origin")}}, true
}

func (o *Observer) attemptEnd(ctx context.Context, ev workflow.AttemptEvent) {
	r, _ := ctx.Value(attemptCtx).(*running)
	metricAttrs := metric.WithAttributes(FlowKey.String(ev.Flow), ExecutorKey.String(string(ev.Executor)), OutcomeKey.String(string(ev.Outcome)))
	o.attempts.Add(ctx, 1, metricAttrs)
	if r == nil {
		return
	}
	o.attemptDuration.Record(ctx, time.Since(r.start).Seconds(), metricAttrs)
	span := r.span
	attrs := []attribute.KeyValue{OutcomeKey.String(string(ev.Outcome))}
	if ev.Flow != "" {
		attrs = append(attrs, FlowKey.String(ev.Flow))
	}
	if ev.ID != "" {
		attrs = append(attrs, KeyIDKey.String(ev.ID))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, AttemptKey.Int(ev.Attempt))
	}
	if ev.RecoveryPoint != "" {
		attrs = append(attrs, RecoveryPointKey.String(ev.RecoveryPoint))
	}
	if ev.Phase != "" {
		attrs = append(attrs, PhaseKey.String(ev.Phase))
	}
	span.SetAttributes(attrs...)
	// A sweep linked at its start; an attempt of Do or Resume learns the key's origin
	// from the row it read.
	if ev.Executor != workflow.ExecutorSweeper {
		if l, ok := o.link(ev.Origin); ok && l.SpanContext.SpanID() != span.SpanContext().SpanID() {
			span.AddLink(l)
		}
	}
	if failed(ev.Outcome) {
		span.SetAttributes(semconv.ErrorTypeKey.String(string(ev.Outcome)))
		msg := string(ev.Outcome)
		if ev.Err != nil {
			msg = ev.Err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// failed reports whether an attempt that ended with outcome failed: an answer (a
// replay, a 409, a 422) is not a failure.
func failed(o workflow.Outcome) bool {
	switch o {
	case workflow.OutcomeFinished, workflow.OutcomeReplayed, workflow.OutcomeInProgress, workflow.OutcomeMismatch, workflow.OutcomeParked:
		return false
	}
	return true
}

func (o *Observer) phaseStart(ctx context.Context, ev workflow.PhaseEvent) context.Context {
	attrs := []attribute.KeyValue{
		FlowKey.String(ev.Flow), PhaseKey.String(ev.Phase), PhaseKindKey.String(kind(ev.Kind)),
		KeyIDKey.String(ev.ID), AttemptKey.Int(ev.Attempt),
	}
	if o.cfg.RecordDerivedKeys && ev.Kind == phases.KindCall {
		attrs = append(attrs, DerivedKeyKey.String(ev.DerivedKey()))
	}
	ctx, span := o.tracer.Start(ctx, spanName("idemflow.phase", ev.Phase), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, phaseCtx, &running{span: span, start: time.Now()})
}

func (o *Observer) phaseEnd(ctx context.Context, ev workflow.PhaseEvent, err error) {
	r, _ := ctx.Value(phaseCtx).(*running)
	if r == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	o.phaseDuration.Record(ctx, time.Since(r.start).Seconds(), metric.WithAttributes(
		FlowKey.String(ev.Flow), PhaseKey.String(ev.Phase), PhaseKindKey.String(kind(ev.Kind)), PhaseOutcomeKey.String(outcome)))
	r.span.SetAttributes(PhaseOutcomeKey.String(outcome))
	if err != nil {
		r.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		r.span.SetStatus(codes.Error, err.Error())
	}
	r.span.End()
}

// errorType is a phase error's error.type: a few known conditions by name, else the
// semantic conventions' fallback (the error's Go type).
func errorType(err error) string {
	switch {
	case errors.Is(err, workflow.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, workflow.ErrUnavailable):
		return "db_unavailable"
	case errors.Is(err, workflow.ErrConflict):
		return "conflict"
	}
	return semconv.ErrorType(err).Value.AsString()
}

func kind(k phases.Kind) string {
	if k == phases.KindCall {
		return "call"
	}
	return "tx"
}

func (o *Observer) keyEvent(ctx context.Context, ev workflow.KeyEvent) {
	o.keyEvents.Add(ctx, 1, metric.WithAttributes(FlowKey.String(ev.Flow), EventKey.String(string(ev.Kind))))
}

// origin is the traceparent of the attempt's span, stored with a new key.
func (o *Observer) origin(ctx context.Context) string {
	c := propagation.MapCarrier{}
	o.prop.Inject(ctx, c)
	return c.Get("traceparent")
}

// Gauger is what ObserveKeys reads the gauges from; *workflow.Engine satisfies it.
// A Gauger that also has a method Flows() []string (as *workflow.Engine has) has a
// series for each of those flows from the first collection, at 0 when it has no
// unfinished keys.
type Gauger interface {
	GaugeKeys(ctx context.Context) ([]workflow.KeyGauge, error)
}

// flowLister is the optional part of a Gauger: the flows it runs.
type flowLister interface{ Flows() []string }

// ObserveKeys reports the gauges of engine at every collection of the meter provider's
// readers, from one indexed query (workflow.Engine.GaugeKeys) per collection, whatever
// the traffic:
//
//   - idemflow.keys: unfinished keys by flow and status. The statuses do not overlap:
//     in_progress counts keys in progress that are not stuck, stuck those a sweeper
//     would take now, dead those dead-lettered; their sum is every unfinished key. They
//     are counted as the admin API's CountKeys (and the CLI's stats) counts them.
//   - idemflow.keys.oldest_due: by flow, how long the stuck key that has waited
//     longest has been due for a sweeper, in seconds by the database clock; 0 when
//     none is stuck. It grows without bound when no sweeper runs or it cannot keep up.
//
// Every flow engine runs (see Gauger) and every flow seen since has its series, at 0
// when it has no unfinished keys, so that a series reads 0 rather than vanishing.
// Unregister the returned registration to stop.
func (o *Observer) ObserveKeys(engine Gauger) (metric.Registration, error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	return o.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, o.cfg.GaugeTimeout)
		defer cancel()
		gauges, err := engine.GaugeKeys(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if fl, ok := engine.(flowLister); ok {
			for _, f := range fl.Flows() {
				seen[f] = true
			}
		}
		now := map[string]workflow.KeyGauge{}
		for _, g := range gauges {
			now[g.Flow] = g
			seen[g.Flow] = true
		}
		for flow := range seen {
			o.observeFlow(obs, flow, now[flow])
		}
		return nil
	}, o.keys, o.oldestDue)
}

// observeFlow reports one flow's gauges.
func (o *Observer) observeFlow(obs metric.Observer, flow string, g workflow.KeyGauge) {
	byStatus := map[workflow.KeyStatus]int64{
		workflow.KeysInProgress: g.InProgress - g.Stuck,
		workflow.KeysStuck:      g.Stuck,
		workflow.KeysDead:       g.Dead,
	}
	for status, n := range byStatus {
		obs.ObserveInt64(o.keys, n, metric.WithAttributes(FlowKey.String(flow), KeyStatusKey.String(string(status))))
	}
	obs.ObserveFloat64(o.oldestDue, g.OldestDue.Seconds(), metric.WithAttributes(FlowKey.String(flow)))
}
