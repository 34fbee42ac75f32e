package otelsdk_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// chargeHandler is an HTTP handler that runs the test flow for the key in the
// Idempotency-Key header, under the request's context: what a server's handler does.
func chargeHandler(e *workflow.Engine) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := e.Do(r.Context(), req(r.Header.Get("Idempotency-Key"), `{"amount":7}`))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(resp.Response.Status)
	})
}

// serverHandler is h behind otelhttp: a server span per request, a child of the
// caller's span when the request carries a traceparent.
func serverHandler(h http.Handler, tp trace.TracerProvider) http.Handler {
	return otelhttp.NewHandler(h, "POST /charges",
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))
}

// traced is a request to url whose traceparent is sc's.
func traced(t *testing.T, url, key string, sc trace.SpanContext) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":7}`))
	require.NoError(t, err)
	r.Header.Set("Idempotency-Key", key)
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(r.Header))
	return r
}

// TestAttemptUnderServerSpan: behind otelhttp, the attempt span is a child of the
// request's server span, itself a child of the client's span named in traceparent: one
// trace from the client through the server to every phase.
func TestAttemptUnderServerSpan(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	srv := httptest.NewServer(serverHandler(chargeHandler(b.engine), b.tp))
	defer srv.Close()
	_, client := b.tp.Tracer("test").Start(context.Background(), "client")
	resp, err := http.DefaultClient.Do(traced(t, srv.URL, "k", client.SpanContext()))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	client.End()
	srv.Close() // waits for the handler to return, and otelhttp to end its span

	var server sdktrace.ReadOnlySpan
	var names []string
	for _, s := range b.spans.Ended() {
		names = append(names, s.Name())
		if s.InstrumentationScope().Name == otelhttp.ScopeName {
			require.Nil(t, server, "one server span")
			server = s
		}
	}
	require.NotNil(t, server, "otelhttp's server span among %v", names)
	require.Equal(t, trace.SpanKindServer, server.SpanKind())
	require.Equal(t, client.SpanContext().TraceID(), server.SpanContext().TraceID())
	require.Equal(t, client.SpanContext().SpanID(), server.Parent().SpanID())

	attempts := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, attempts, 1)
	a := attempts[0]
	require.Equal(t, server.SpanContext().TraceID(), a.SpanContext().TraceID(), "the attempt is in the request's trace")
	require.Equal(t, server.SpanContext().SpanID(), a.Parent().SpanID(), "the attempt's parent is the server span")
	require.Equal(t, "finished", attr(a, otelidemflow.OutcomeKey).AsString())
	var phaseSpans int
	for _, s := range b.spans.Ended() {
		if s.Parent().SpanID() == a.SpanContext().SpanID() {
			require.Equal(t, a.SpanContext().TraceID(), s.SpanContext().TraceID())
			phaseSpans++
		}
	}
	require.Equal(t, 3, phaseSpans, "reserve, pay and settle under the attempt")

	info, err := b.engine.InspectKey(context.Background(), "acct", "k")
	require.NoError(t, err)
	require.Equal(t, traceparent(a.SpanContext()), info.Origin, "the key's origin is the attempt span")
}

// traceparent is sc as a W3C traceparent.
func traceparent(sc trace.SpanContext) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c.Get("traceparent")
}

// The killed server: a child process that serves one charge behind otelhttp, its
// request carrying the parent's traceparent, and SIGKILLs itself when the call phase is
// about to run (the key's row and origin committed, the lease live, nothing of the call
// sent). Before it dies it prints its server and attempt spans.
const (
	envKillDB          = "IDEMFLOW_OTEL_KILL_DB_URL"
	envKillProvider    = "IDEMFLOW_OTEL_KILL_PROVIDER_URL"
	envKillTraceparent = "IDEMFLOW_OTEL_KILL_TRACEPARENT"
)

func init() { childproc.Register("otelkill", runKilledServer) }

// spanLine is a span the killed server printed.
type spanLine struct {
	Span, Trace, Parent string
}

func runKilledServer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envKillDB))
	if err != nil {
		childproc.Fail("connect", err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	obs, err := otelidemflow.New(&otelidemflow.Config{TracerProvider: tp})
	if err != nil {
		childproc.Fail("observer", err)
	}
	report := workflow.Hooks{AttemptStart: func(ctx context.Context, _ workflow.AttemptEvent) context.Context {
		s := trace.SpanFromContext(ctx).(sdktrace.ReadOnlySpan)
		childproc.Emit(spanLine{Span: s.SpanContext().SpanID().String(), Trace: s.SpanContext().TraceID().String(), Parent: s.Parent().SpanID().String()})
		return ctx
	}}
	kill := childproc.NewPoints(testflow.Pay+"/"+childproc.BeforeCall, 0, func(string) { childproc.Kill() })
	e, err := workflow.New(pool, &workflow.Config{Hooks: kill.Hooks(workflow.JoinHooks(obs.Hooks(), report))})
	if err != nil {
		childproc.Fail("engine", err)
	}
	if err := e.Register(testflow.Flow(testflow.Options{ProviderURL: os.Getenv(envKillProvider)})); err != nil {
		childproc.Fail("register", err)
	}
	inner := chargeHandler(e)
	h := serverHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := trace.SpanFromContext(r.Context()).SpanContext()
		childproc.Emit(spanLine{Span: s.SpanID().String(), Trace: s.TraceID().String()})
		inner.ServeHTTP(w, r)
	}), tp)
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":7}`))
	r.Header.Set("Idempotency-Key", "killed")
	r.Header.Set("Traceparent", os.Getenv(envKillTraceparent))
	h.ServeHTTP(httptest.NewRecorder(), r)
	childproc.Fail("the kill point never fired", nil)
}

// TestSweepLinksToKilledRequest: a key claimed by a request of trace T whose server
// was killed (SIGKILL, before its call phase) and that a sweeper finished: the
// sweeper's attempt span is the root of a trace of its own (the sweeper has no pass
// span) with one link, to the killed request's attempt span in T; its phases are its
// children.
func TestSweepLinksToKilledRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, client := b.tp.Tracer("test").Start(context.Background(), "client")
	client.End()
	T := client.SpanContext()
	c := childproc.Start(t, "^$", childproc.Program("otelkill"), envKillDB+"="+b.db.URL,
		envKillProvider+"="+b.provider.URL, envKillTraceparent+"="+traceparent(T))
	var server, attempt spanLine
	c.Next(t, 2*time.Minute, &server)
	c.Next(t, 2*time.Minute, &attempt)
	killed, rest := c.Killed(t)
	require.True(t, killed, "stderr:\n%s", c.Stderr())
	require.Empty(t, rest)
	require.Equal(t, T.TraceID().String(), server.Trace, "the killed server's span is in T")
	require.Equal(t, T.TraceID().String(), attempt.Trace, "the killed attempt is in T")
	require.Equal(t, server.Span, attempt.Parent, "the killed attempt's parent is its server span")
	require.Zero(t, b.provider.Made(), "killed before the call")

	info, err := b.engine.InspectKey(context.Background(), "acct", "killed")
	require.NoError(t, err)
	require.Equal(t, "00-"+T.TraceID().String()+"-"+attempt.Span+"-01", info.Origin, "the origin is the killed attempt's span")

	testflow.Sweepable(t, b.db.Pool)
	require.Equal(t, 1, b.sweep(t, 0).Finished)
	testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", "killed")
	swept := b.ended("idemflow.attempt " + testflow.Name)
	require.Len(t, swept, 1)
	s := swept[0]
	require.Equal(t, "sweeper", attr(s, otelidemflow.ExecutorKey).AsString())
	require.Equal(t, "finished", attr(s, otelidemflow.OutcomeKey).AsString())
	require.False(t, s.Parent().IsValid(), "the sweep's attempt is a root span")
	require.NotEqual(t, T.TraceID(), s.SpanContext().TraceID(), "in a trace of its own")
	require.Len(t, s.Links(), 1)
	l := s.Links()[0].SpanContext
	require.Equal(t, T.TraceID(), l.TraceID(), "linked to the request's trace")
	require.Equal(t, attempt.Span, l.SpanID().String(), "linked to the killed request's attempt span")
	require.True(t, l.IsRemote())
	var under []string
	for _, p := range b.spans.Ended() {
		if p.Parent().SpanID() == s.SpanContext().SpanID() {
			under = append(under, p.Name())
		}
	}
	require.Equal(t, []string{"idemflow.phase pay", "idemflow.phase settle"}, under)
}
