package chargeflow_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// TestChargeSurvivesCrashes: a charge, paid or declined, killed at any boundary and
// finished by a retry or a sweeper, is one charge row and one provider payment, and
// its answer is the stored one; with Go-code phases (Flow) and pipelined ones
// (PipelinedFlow).
func TestChargeSurvivesCrashes(t *testing.T) {
	t.Parallel()
	for name, flow := range map[string]func(*chargeflow.ProviderClient) phases.Flow{"Go": chargeflow.Flow, "Pipelined": chargeflow.PipelinedFlow} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testChargeSurvivesCrashes(t, flow)
		})
	}
}

func testChargeSurvivesCrashes(t *testing.T, flow func(*chargeflow.ProviderClient) phases.Flow) {
	for _, tc := range []struct {
		name, source, status string
		code                 int
	}{
		{"Paid", "tok_visa", "succeeded", http.StatusCreated},
		{"Declined", "card_declined", "failed", http.StatusPaymentRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := idemflowtest.NewDB(t, chargeflow.Schema)
			provider := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{Decline: func(_ string, body []byte) bool {
				req, err := chargeflow.ParseRequest(body)
				return err == nil && req.Source == "card_declined"
			}})
			idemflowtest.CrashMatrix(t, idemflowtest.Crash{
				DB:   db,
				Flow: flow(&chargeflow.ProviderClient{BaseURL: provider.URL, HTTP: http.DefaultClient}),
				Request: workflow.Request{Scope: "acct", Key: "ch", Route: "/v1/charges",
					Body: []byte(`{"amount":1299,"currency":"usd","source":"` + tc.source + `"}`)},
				Check: func(t testing.TB, c *idemflowtest.Case) {
					var rows int
					var status string
					require.NoError(t, c.DB.Pool.QueryRow(context.Background(), `SELECT count(*), max(status) FROM charges
						WHERE account_id = $1 AND idempotency_key = $2`, c.Request.Scope, c.Request.Key).Scan(&rows, &status))
					require.Equal(t, 1, rows, "charge rows")
					require.Equal(t, tc.status, status)
					require.Equal(t, tc.code, c.Answer.Status)
					pay, ok := provider.Effect(c.DerivedKey(chargeflow.PhaseProvider))
					require.True(t, ok, "the provider was asked under the derived key")
					require.Equal(t, tc.code == http.StatusPaymentRequired, pay.Declined)
					if !pay.Declined {
						var ch chargeflow.Charge
						require.NoError(t, json.Unmarshal(c.Answer.Body, &ch))
						require.Equal(t, pay.ID, *ch.ProviderPaymentID)
					}
				},
			})
		})
	}
}
