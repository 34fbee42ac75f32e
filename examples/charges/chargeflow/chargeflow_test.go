package chargeflow_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
)

func TestParseRequest(t *testing.T) {
	t.Parallel()
	ok, err := chargeflow.ParseRequest([]byte(`{"amount":5,"currency":"usd","source":"tok"}`))
	require.NoError(t, err)
	require.Equal(t, chargeflow.Request{Amount: 5, Currency: "usd", Source: "tok"}, ok)
	for name, body := range map[string]string{
		"NotJSON":      `amount=5`,
		"Zero":         `{"amount":0,"currency":"usd","source":"tok"}`,
		"Fraction":     `{"amount":1.5,"currency":"usd","source":"tok"}`,
		"Upper":        `{"amount":5,"currency":"USD","source":"tok"}`,
		"NoSource":     `{"amount":5,"currency":"usd"}`,
		"UnknownField": `{"amount":5,"currency":"usd","source":"tok","x":1}`,
		"TwoObjects":   `{"amount":5,"currency":"usd","source":"tok"}{}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := chargeflow.ParseRequest([]byte(body))
			require.Error(t, err)
		})
	}
}

func TestProviderDedupesConcurrentRequests(t *testing.T) {
	t.Parallel()
	p := chargeflow.NewProvider(0, 0)
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	c := &chargeflow.ProviderClient{BaseURL: srv.URL, HTTP: srv.Client()}
	req := chargeflow.Request{Amount: 5, Currency: "usd", Source: "tok"}

	ids := make([]string, 16)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], _ = c.Pay(context.Background(), "same-key", req)
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	require.NotEmpty(t, ids[0])
	other, err := c.Pay(context.Background(), "other-key", req)
	require.NoError(t, err)
	require.NotEqual(t, ids[0], other)

	_, err = c.Pay(context.Background(), "declined-key", chargeflow.Request{Amount: 5, Currency: "usd", Source: "card_declined"})
	var dec *chargeflow.DeclinedError
	require.True(t, errors.As(err, &dec))

	resp, err := srv.Client().Get(srv.URL + "/v1/stats")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// A restarted provider (a new Provider: the fake keeps its payments in memory) numbers
// its payments from 1 again, but never repeats a payment id of the last run.
func TestProviderIDsUniqueAcrossRestarts(t *testing.T) {
	t.Parallel()
	req := chargeflow.Request{Amount: 5, Currency: "usd", Source: "tok"}
	seen := map[string]bool{}
	for range 3 { // three runs of the provider, each paying the same key first
		srv := httptest.NewServer(chargeflow.NewProvider(0, 0).Handler())
		c := &chargeflow.ProviderClient{BaseURL: srv.URL, HTTP: srv.Client()}
		id, err := c.Pay(context.Background(), "k", req)
		srv.Close()
		require.NoError(t, err)
		require.Regexp(t, `^pay_[a-z2-7]{8}_000001$`, id, "each run's first payment")
		require.False(t, seen[id], "%s repeats an earlier run's id", id)
		seen[id] = true
	}
}

func TestProviderFailRate(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(chargeflow.NewProvider(0, 1).Handler())
	defer srv.Close()
	c := &chargeflow.ProviderClient{BaseURL: srv.URL, HTTP: srv.Client()}
	_, err := c.Pay(context.Background(), "k", chargeflow.Request{Amount: 5, Currency: "usd", Source: "tok"})
	require.ErrorContains(t, err, "503")
}
