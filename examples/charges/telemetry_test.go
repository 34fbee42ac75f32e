package main

import (
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeTelemetry: serve -telemetry prometheus answers as without it, and its
// /metrics endpoint shows the engine's attempts by outcome.
func TestServeTelemetry(t *testing.T) {
	t.Parallel()
	s := newStack(t, direct)
	observed := s.serve(t, nil, "-telemetry", "prometheus", "-metrics-addr", "127.0.0.1:0")
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
}
