package phases_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
)

// TestProblem: one call makes a problem details answer with its Content-Type, its
// standard members and the extra ones, in the same bytes every time; as a failure
// too; and bad extension members are refused.
func TestProblem(t *testing.T) {
	t.Parallel()
	resp, err := phases.Problem(http.StatusPaymentRequired, "https://example.com/probs/declined", "card declined",
		"insufficient funds", map[string]any{"instance": "/v1/charges/ch_1", "decline_code": "insufficient_funds"})
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, resp.Status)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Equal(t, `{"decline_code":"insufficient_funds","detail":"insufficient funds","instance":"/v1/charges/ch_1",`+
		`"status":402,"title":"card declined","type":"https://example.com/probs/declined"}`, string(resp.Body))

	t.Run("Defaults", func(t *testing.T) {
		resp, err := phases.Problem(http.StatusBadRequest, "", "", "", nil)
		require.NoError(t, err)
		require.Equal(t, `{"status":400,"title":"Bad Request","type":"about:blank"}`, string(resp.Body))
	})

	t.Run("Fail", func(t *testing.T) {
		err := phases.FailProblem(http.StatusConflict, "", "already captured", "", nil)
		var term *phases.TerminalError
		require.ErrorAs(t, err, &term)
		require.Equal(t, http.StatusConflict, term.Response.Status)
		require.Equal(t, "application/problem+json", term.Response.Header.Get("Content-Type"))
		require.JSONEq(t, `{"status":409,"title":"already captured","type":"about:blank"}`, string(term.Response.Body))
	})

	t.Run("DocSnippet", func(t *testing.T) {
		_, err := invalidRequest(errors.New("amount must be positive"))
		var term *phases.TerminalError
		require.ErrorAs(t, err, &term)
		require.JSONEq(t, `{"type":"about:blank","title":"invalid request","status":400,"detail":"amount must be positive"}`, string(term.Response.Body))
	})

	t.Run("BadExtra", func(t *testing.T) {
		for name, extra := range map[string]map[string]any{
			"StandardMember": {"status": 200},
			"NotJSON":        {"ch": make(chan int)},
		} {
			_, err := phases.Problem(http.StatusBadRequest, "", "bad", "", extra)
			require.ErrorIs(t, err, phases.ErrInvalidProblem, name)
			err = phases.FailProblem(http.StatusBadRequest, "", "bad", "", extra)
			require.ErrorIs(t, err, phases.ErrInvalidProblem, name)
			var term *phases.TerminalError
			require.NotErrorAs(t, err, &term, "%s: transient, nothing stored", name)
		}
	})
}

// invalidRequest is the snippet of phases/doc.go.
func invalidRequest(err error) (*phases.Response, error) {
	return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
}
