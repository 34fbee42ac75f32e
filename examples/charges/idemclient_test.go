package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemclient"
)

// clientAnswer is what one sender of a key got from idemclient.
type clientAnswer struct {
	status   int
	replayed bool
	body     string
	err      error
}

// TestIdemclientServerKilled is the charges service used by Go clients on
// idemclient's default policy: 40 keys, two senders per key at once, and the server
// SIGKILLed while the charges run, then restarted on the same address. Every sender
// gets its key's answer (201, the same charge for both), at most one of the two is
// not a replay, and each key has one charge and one provider payment.
func TestIdemclientServerKilled(t *testing.T) {
	t.Parallel()
	const keys, account = 40, "acct_idemclient"
	s := &stack{db: direct(t)}
	s.provider = run(t, nil, "provider", "-addr", "127.0.0.1:0", "-latency", "300ms")
	// A short lease, so that the keys the killed server held are free again soon;
	// until then their retries get 409 with Retry-After.
	s.server = s.serve(t, nil, "-lease", "2s")
	addr := strings.TrimPrefix(s.server.url, "http://")

	var mu sync.Mutex
	retries := map[string]int{} // by what the retried attempt got
	most := 0                   // the most retries one sender made
	transport, err := idemclient.NewTransport(nil, &idemclient.Config{
		OnRetry: func(ctx context.Context, ev idemclient.RetryEvent) {
			mu.Lock()
			defer mu.Unlock()
			what := fmt.Sprint(ev.Status)
			if ev.Status == 0 {
				what = "network error"
			}
			retries[what]++
			most = max(most, ev.Attempt)
		},
	})
	require.NoError(t, err)
	client := &http.Client{Transport: transport}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	answers := make([][2]clientAnswer, keys)
	var wg sync.WaitGroup
	for i := range keys {
		key := idemclient.KeyFrom("charge", fmt.Sprint(i))
		for sender := range 2 {
			wg.Go(func() { answers[i][sender] = sendCharge(ctx, client, s.server.url, account, key) })
		}
	}

	// Killed once some payments are made: keys are then before, in and after their
	// provider call.
	eventually(t, "the provider to make payments", func() bool { return s.stats(t).Payments >= 3 })
	s.server.signal(syscall.SIGKILL)
	s.server.exitCode()
	finished := s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope = $1 AND status = 'finished'`, account)
	require.Less(t, finished, keys, "the server was killed mid-flow")
	t.Logf("killed the server with %d of %d keys finished, %d provider payments made", finished, keys, s.stats(t).Payments)
	s.server = s.serve(t, nil, "-lease", "2s", "-addr", addr)

	wg.Wait()
	mu.Lock()
	t.Logf("retries by what the attempt got: %v; at most %d for one sender (MaxAttempts %d)", retries, most, idemclient.MaxAttemptsDefault)
	mu.Unlock()
	st := s.stats(t)
	payments := map[string]bool{}
	for i, pair := range answers {
		key := idemclient.KeyFrom("charge", fmt.Sprint(i))
		for _, a := range pair {
			require.NoError(t, a.err, "key %s", key)
			require.Equal(t, http.StatusCreated, a.status, "key %s: %s", key, a.body)
		}
		require.Equal(t, pair[0].body, pair[1].body, "key %s: one charge for both senders", key)
		require.True(t, pair[0].replayed || pair[1].replayed, "key %s: at most one answer is not a replay", key)
		require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key = $2`, account, key))
		require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key = $2 AND status = 'succeeded'`, account, key))
		byKey := st.ByKey[s.derivedKey(t, account, key)]
		require.NotNil(t, byKey, "key %s: the provider never saw its derived key", key)
		require.NotEmpty(t, byKey.PaymentID, "key %s", key)
		require.False(t, payments[byKey.PaymentID], "key %s: payment %s counted twice", key, byKey.PaymentID)
		payments[byKey.PaymentID] = true
	}
	require.Equal(t, keys, st.Payments, "one provider payment per key")
}

// sendCharge posts the test charge under key through client.
func sendCharge(ctx context.Context, client *http.Client, base, account, key string) clientAnswer {
	ctx = idemclient.WithKey(ctx, key)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return clientAnswer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return clientAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return clientAnswer{status: resp.StatusCode, replayed: idemclient.Replayed(resp), body: string(b), err: err}
}
