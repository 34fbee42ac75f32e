package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// TestServeTelemetry: serve -telemetry prometheus answers as without it, and its
// /metrics endpoint shows the engine's attempts by outcome and its sweeper's liveness.
func TestServeTelemetry(t *testing.T) {
	t.Parallel()
	s := newStack(t, direct)
	observed := s.serve(t, nil, "-telemetry", "prometheus", "-metrics-addr", "127.0.0.1:0", "-sweeper")
	first := post(t, observed.url, "acct_tel", "k1", body)
	require.Equal(t, http.StatusCreated, first.status)
	replay := post(t, observed.url, "acct_tel", "k1", body)
	require.Equal(t, first.status, replay.status)
	require.Equal(t, first.body, replay.body)
	require.Equal(t, http.StatusUnprocessableEntity, post(t, observed.url, "acct_tel", "k1", `{"amount":1,"currency":"usd","source":"tok_visa"}`).status)

	m := regexp.MustCompile(`metrics: (http://\S+/metrics)`).FindStringSubmatch(observed.output())
	require.NotNil(t, m, observed.output())
	resp, err := http.Get(m[1])
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, outcome := range []string{"finished", "replayed", "mismatch"} {
		require.Regexp(t, `idemflow_attempts_total\{idemflow_executor="client",idemflow_flow="create_charge",idemflow_outcome="`+outcome+`"[^}]*\} 1\n`, string(b))
	}
	require.Regexp(t, `idemflow_phase_duration_seconds_count\{idemflow_flow="create_charge",idemflow_phase="provider_charge",idemflow_phase_kind="call",idemflow_phase_outcome="ok"[^}]*\} 1\n`, string(b))
	require.Regexp(t, `idemflow_sweeper_last_pass_seconds(\{[^}]*\})? \d`, string(b), "the embedded sweeper's liveness")
}

// stdoutSpan is what TestServeTraces reads of a span serve -telemetry stdout printed.
type stdoutSpan struct {
	Name                 string
	SpanKind             int
	SpanContext, Parent  struct{ TraceID, SpanID string }
	InstrumentationScope struct{ Name string }
}

// TestServeTraces: with serve -telemetry stdout, a request whose traceparent names a
// client span is one trace: otelhttp's server span a child of the client's span, the
// charge's attempt span a child of the server span.
func TestServeTraces(t *testing.T) {
	t.Parallel()
	s := newStack(t, direct)
	traced := s.serve(t, nil, "-telemetry", "stdout")
	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, traced.url+"/v1/charges", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_trace")
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	traced.signal(syscall.SIGTERM) // a graceful stop: the handler returns, the spans are printed
	require.Equal(t, 0, traced.exitCode(), traced.output())

	var server, attempt *stdoutSpan
	for _, js := range regexp.MustCompile(`(?ms)^\{\n.*?^\}\n`).FindAllString(traced.stdout(), -1) {
		var sp stdoutSpan
		require.NoError(t, json.Unmarshal([]byte(js), &sp), js)
		switch {
		case sp.InstrumentationScope.Name == otelhttp.ScopeName:
			require.Nil(t, server, "one server span")
			server = &sp
		case sp.Name == "idemflow.attempt create_charge":
			require.Nil(t, attempt, "one attempt span")
			attempt = &sp
		}
	}
	require.NotNil(t, server, traced.output())
	require.NotNil(t, attempt, traced.output())
	require.Equal(t, int(trace.SpanKindServer), server.SpanKind)
	require.Equal(t, traceID, server.SpanContext.TraceID)
	require.Equal(t, clientSpan, server.Parent.SpanID, "the server span's parent is the client's span")
	require.Equal(t, traceID, attempt.SpanContext.TraceID, "the attempt is in the request's trace")
	require.Equal(t, server.SpanContext.SpanID, attempt.Parent.SpanID, "the attempt's parent is the server span")
}
