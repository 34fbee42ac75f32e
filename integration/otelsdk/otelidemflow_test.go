package otelsdk_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// bundle is a schema, a provider, in-memory exporters and an engine observed by them.
type bundle struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	spans    *tracetest.SpanRecorder
	tp       *sdktrace.TracerProvider
	reader   *sdkmetric.ManualReader
	obs      *otelidemflow.Observer
	engine   *workflow.Engine
}

func setup(t *testing.T, before func(context.Context, phases.DBTX, *phases.Run) error) *bundle {
	t.Helper()
	b := &bundle{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	b.db, b.provider = testflow.Start(t)
	b.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	t.Cleanup(func() {
		require.NoError(t, b.tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	obs, err := otelidemflow.New(&otelidemflow.Config{TracerProvider: b.tp, MeterProvider: mp, RecordDerivedKeys: true})
	require.NoError(t, err)
	b.obs = obs
	b.engine = b.newEngine(t, before)
	return b
}

func (b *bundle) newEngine(t *testing.T, before func(context.Context, phases.DBTX, *phases.Run) error) *workflow.Engine {
	return testflow.Engine(t, b.db.Pool, &workflow.Config{Hooks: b.obs.Hooks()}, b.provider, before)
}

func (b *bundle) sweep(t *testing.T, maxAttempts int) workflow.SweepStats {
	t.Helper()
	st, err := b.engine.Sweep(context.Background(), &workflow.SweeperConfig{Grace: -1, MaxAttempts: maxAttempts})
	require.NoError(t, err)
	return st
}

func req(key, body string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// ended returns the ended spans named name.
func (b *bundle) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func keyID(t *testing.T, b *bundle, key string) string {
	t.Helper()
	info, err := b.engine.InspectKey(context.Background(), "acct", key)
	require.NoError(t, err)
	return info.ID
}

// TestTraceOfRequest: one request is one trace: its attempt span under the caller's
// span, a child span per phase with kind and outcome, the derived key on the call.
func TestTraceOfRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, parent := b.tp.Tracer("test").Start(context.Background(), "POST /charges")
	_, err := b.engine.Do(ctx, req("k", `{"amount":5}`))
	require.NoError(t, err)
	parent.End()

	attempts := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, attempts, 1)
	a := attempts[0]
	tid := parent.SpanContext().TraceID()
	require.Equal(t, tid, a.SpanContext().TraceID())
	require.Equal(t, parent.SpanContext().SpanID(), a.Parent().SpanID())
	require.Equal(t, "finished", attr(a, otelidemflow.OutcomeKey).AsString())
	require.Equal(t, "client", attr(a, otelidemflow.ExecutorKey).AsString())
	require.Equal(t, keyID(t, b, "k"), attr(a, otelidemflow.KeyIDKey).AsString())
	require.EqualValues(t, 1, attr(a, otelidemflow.AttemptKey).AsInt64())
	require.Equal(t, codes.Unset, a.Status().Code)
	require.Empty(t, a.Links(), "the first attempt links to nothing")
	require.Equal(t, attribute.EMPTY, attr(a, otelidemflow.IdempotencyKey).Type(), "keys are not recorded unless asked")

	var names, kinds []string
	for _, s := range b.spans.Ended() {
		if s.Parent().SpanID() != a.SpanContext().SpanID() {
			continue
		}
		require.Equal(t, tid, s.SpanContext().TraceID())
		names = append(names, s.Name())
		kinds = append(kinds, attr(s, otelidemflow.PhaseKindKey).AsString()+"/"+attr(s, otelidemflow.PhaseOutcomeKey).AsString())
		if attr(s, otelidemflow.PhaseKey).AsString() == testflow.Pay {
			require.Equal(t, keyID(t, b, "k")+":"+testflow.Pay, attr(s, otelidemflow.DerivedKeyKey).AsString())
		}
	}
	require.Equal(t, []string{"idemflow.phase reserve", "idemflow.phase pay", "idemflow.phase settle"}, names)
	require.Equal(t, []string{"tx/ok", "call/ok", "tx/ok"}, kinds)

	// The replay is its own short trace under its caller, with no phases.
	b.spans.Reset()
	_, err = b.engine.Do(context.Background(), req("k", `{"amount":5}`))
	require.NoError(t, err)
	require.Len(t, b.spans.Ended(), 1)
	require.Equal(t, "replayed", attr(b.spans.Ended()[0], otelidemflow.OutcomeKey).AsString())
}

// TestSweepLinksToOrigin: a key whose request failed half-way and that a sweeper
// finished has a sweep span, in a trace of its own, linked to the original request's
// attempt span; so has the client's later retry of a key that failed.
func TestSweepLinksToOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.provider.FailNext(1)
	ctx, parent := b.tp.Tracer("test").Start(context.Background(), "POST /charges")
	_, err := b.engine.Do(ctx, req("k", `{"amount":5}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	parent.End()
	first := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, first, 1)
	origin := first[0].SpanContext()
	require.Equal(t, "released", attr(first[0], otelidemflow.OutcomeKey).AsString())
	require.Equal(t, testflow.Pay, attr(first[0], otelidemflow.PhaseKey).AsString())
	require.Equal(t, codes.Error, first[0].Status().Code)
	info, err := b.engine.InspectKey(context.Background(), "acct", "k")
	require.NoError(t, err)
	require.Contains(t, info.Origin, origin.TraceID().String(), "the origin is stored with the key")

	b.spans.Reset()
	testflow.Sweepable(t, b.db.Pool)
	require.Equal(t, 1, b.sweep(t, 0).Finished)
	swept := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, swept, 1)
	s := swept[0]
	require.Equal(t, "sweeper", attr(s, otelidemflow.ExecutorKey).AsString())
	require.Equal(t, "finished", attr(s, otelidemflow.OutcomeKey).AsString())
	require.EqualValues(t, 2, attr(s, otelidemflow.AttemptKey).AsInt64())
	require.NotEqual(t, origin.TraceID(), s.SpanContext().TraceID(), "a sweep is a trace of its own")
	require.Len(t, s.Links(), 1)
	require.Equal(t, origin.TraceID(), s.Links()[0].SpanContext.TraceID())
	require.Equal(t, origin.SpanID(), s.Links()[0].SpanContext.SpanID(), "linked to the request's attempt span")
	var phasesUnder []string
	for _, p := range b.spans.Ended() {
		if p.Parent().SpanID() == s.SpanContext().SpanID() {
			phasesUnder = append(phasesUnder, p.Name())
		}
	}
	require.Equal(t, []string{"idemflow.phase pay", "idemflow.phase settle"}, phasesUnder)

	// A client's retry of a released key links to the origin too.
	b.provider.FailNext(1)
	_, err = b.engine.Do(context.Background(), req("r", `{"amount":6}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	originR := b.ended("idemflow.attempt " + testflow.Name)[1].SpanContext()
	b.spans.Reset()
	retryCtx, retryParent := b.tp.Tracer("test").Start(context.Background(), "POST /charges (retry)")
	_, err = b.engine.Do(retryCtx, req("r", `{"amount":6}`))
	require.NoError(t, err)
	retryParent.End()
	retry := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, retry, 1)
	require.Equal(t, retryParent.SpanContext().TraceID(), retry[0].SpanContext().TraceID())
	require.Len(t, retry[0].Links(), 1)
	require.Equal(t, originR.SpanID(), retry[0].Links()[0].SpanContext.SpanID())
}

// points are the metric's data points as "attr=value,... → count" for sums and
// counts of histograms.
func points(t *testing.T, b *bundle, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += int64(p.Count)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] = p.Value
				}
			}
		}
	}
	return out
}

func label(s attribute.Set) string {
	var l string
	for _, kv := range s.ToSlice() {
		if kv.Key == otelidemflow.FlowKey {
			continue
		}
		if l != "" {
			l += ","
		}
		l += string(kv.Key) + "=" + kv.Value.String()
	}
	return l
}

// TestMetricsOutcomes: every outcome kind has its data point.
func TestMetricsOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := testflow.NewHolder("held")
	b := setup(t, nil)
	holding := b.newEngine(t, h.Before)

	_, err := b.engine.Do(ctx, req("done", `{"amount":1}`))
	require.NoError(t, err)
	_, err = b.engine.Do(ctx, req("done", `{"amount":1}`))
	require.NoError(t, err)
	_, err = b.engine.Do(ctx, req("done", `{"amount":2}`))
	require.ErrorIs(t, err, workflow.ErrMismatch)
	b.provider.FailNext(1)
	_, err = b.engine.Do(ctx, req("dead", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	testflow.Sweepable(t, b.db.Pool)
	b.provider.FailNext(1)
	require.Equal(t, 1, b.sweep(t, 1).DeadLettered)

	done := make(chan error, 1)
	go func() {
		_, err := holding.Do(ctx, req("held", `{"amount":4}`))
		done <- err
	}()
	<-h.Entered
	_, err = b.engine.Do(ctx, req("held", `{"amount":4}`))
	require.ErrorIs(t, err, workflow.ErrInProgress)
	require.NoError(t, b.engine.ReleaseKey(ctx, "acct", "held"))
	_, err = b.engine.Do(ctx, req("held", `{"amount":4}`))
	require.NoError(t, err, "the retry takes the released key over and finishes it")
	h.Let()
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost)

	got := points(t, b, "idemflow.attempts")
	require.Equal(t, map[string]int64{
		"idemflow.executor=client,idemflow.outcome=finished":       2,
		"idemflow.executor=client,idemflow.outcome=replayed":       1,
		"idemflow.executor=client,idemflow.outcome=mismatch":       1,
		"idemflow.executor=client,idemflow.outcome=released":       1,
		"idemflow.executor=client,idemflow.outcome=in_progress":    1,
		"idemflow.executor=client,idemflow.outcome=lease_lost":     1,
		"idemflow.executor=sweeper,idemflow.outcome=dead_lettered": 1,
	}, got)
	events := points(t, b, "idemflow.key.events")
	for _, e := range []string{"claimed", "finished", "replayed", "mismatch", "released", "swept", "dead_lettered", "in_progress", "taken_over", "lease_lost", "operator_released"} {
		require.Positive(t, events["idemflow.event="+e], "event %s in %v", e, events)
	}
	phaseRuns := points(t, b, "idemflow.phase.duration")
	require.EqualValues(t, 3, phaseRuns["idemflow.phase=reserve,idemflow.phase.kind=tx,idemflow.phase.outcome=ok"], "%v", phaseRuns)
	require.Positive(t, phaseRuns["idemflow.phase=pay,idemflow.phase.kind=call,idemflow.phase.outcome=error"], "%v", phaseRuns)
	require.Positive(t, points(t, b, "idemflow.attempt.duration")["idemflow.executor=client,idemflow.outcome=finished"])
}

// TestKeyGauges: the gauges read 0 before any key, move as keys get stuck,
// dead-lettered and swept, and count as CountKeys (the CLI's stats) counts.
func TestKeyGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	reg, err := b.obs.ObserveKeys(b.engine)
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()
	gauge := func() map[string]int64 {
		g := points(t, b, "idemflow.keys")
		out := map[string]int64{}
		for k, v := range g {
			out[k[len("idemflow.key.status="):]] = v
		}
		return out
	}
	// stats is what CountKeys (and so the CLI's stats) says of unfinished keys.
	stats := func() map[string]int64 {
		counts, err := b.engine.CountKeys(ctx)
		require.NoError(t, err)
		out := map[string]int64{"in_progress": 0, "stuck": 0, "dead": 0}
		for _, c := range counts {
			if c.Status != workflow.KeysFinished {
				out[string(c.Status)] += c.Keys
			}
		}
		return out
	}
	zero := map[string]int64{"in_progress": 0, "stuck": 0, "dead": 0}
	require.Equal(t, zero, gauge(), "a registered flow with no unfinished keys reads 0")
	require.Equal(t, map[string]float64{testflow.Name: 0}, oldestDue(t, b), "none stuck reads 0")

	for _, k := range []string{"a", "b"} {
		b.provider.FailNext(1)
		_, err = b.engine.Do(ctx, req(k, `{"amount":1}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
	}
	require.Equal(t, map[string]int64{"in_progress": 2, "stuck": 0, "dead": 0}, gauge(), "released, backing off: not stuck yet")
	require.Equal(t, stats(), gauge())
	testflow.Sweepable(t, b.db.Pool)
	require.Equal(t, map[string]int64{"in_progress": 0, "stuck": 2, "dead": 0}, gauge())
	require.Equal(t, stats(), gauge())

	// a has been due for an hour, b for ten minutes: the gauge reads a's wait.
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp() - CASE idempotency_key
		WHEN 'a' THEN interval '1 hour' ELSE interval '10 minutes' END WHERE status = 'in_progress'`)
	require.NoError(t, err)
	due := oldestDue(t, b)[testflow.Name]
	require.GreaterOrEqual(t, due, 3600.0, "the oldest due key's wait")
	require.Less(t, due, 3600.0+600, "a's wait, not b's nor more")

	b.provider.FailNext(1)
	st := b.sweep(t, 1) // one of the two fails its last allowed attempt
	require.Equal(t, 1, st.DeadLettered)
	require.Equal(t, 1, st.Finished)
	require.Equal(t, map[string]int64{"in_progress": 0, "stuck": 0, "dead": 1}, gauge())
	require.Equal(t, stats(), gauge())
	require.Equal(t, map[string]float64{testflow.Name: 0}, oldestDue(t, b), "none stuck after the sweep")
	for _, k := range []string{"a", "b"} {
		if err := b.engine.Redrive(ctx, "acct", k); err == nil {
			break
		}
	}
	require.Equal(t, map[string]int64{"in_progress": 0, "stuck": 1, "dead": 0}, gauge(), "re-driven: due")
	require.Equal(t, 1, b.sweep(t, 0).Finished)
	require.Equal(t, zero, gauge(), "a flow stays at zero")
}

// oldestDue is the gauge idemflow.keys.oldest_due by flow.
func oldestDue(t *testing.T, b *bundle) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(context.Background(), &rm))
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && m.Name == "idemflow.keys.oldest_due" {
				for _, p := range g.DataPoints {
					f, _ := p.Attributes.Value(otelidemflow.FlowKey)
					out[f.AsString()] = p.Value
				}
			}
		}
	}
	return out
}
