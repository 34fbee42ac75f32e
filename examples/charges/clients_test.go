package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
)

// The client recipes of docs/API.md ("Retrying with common Go clients"). docs/API.md
// shows these functions as they are here (readme_test.go checks it), and
// TestClientRecipes runs them against the charges service.

// newRetryingClient is go-retryablehttp set up for an API served by idemflow. It
// retries what go-retryablehttp retries by default (network errors, 429, 5xx but 501)
// and 409, and waits what Retry-After says on 409, 429 and 503. The request's context
// bounds the total time.
func newRetryingClient() *retryablehttp.Client {
	c := retryablehttp.NewClient()
	c.CheckRetry = retryInProgress
	c.Backoff = backoffRetryAfter
	c.RetryWaitMin = 250 * time.Millisecond
	c.RetryWaitMax = 30 * time.Second // no less than the service's lease
	c.RetryMax = 30                   // the context's deadline is the real bound
	c.Logger = nil
	return c
}

// retryInProgress retries a 409, which means another request with the key is running
// now (a retry gets its answer), and whatever DefaultRetryPolicy retries.
func retryInProgress(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if err == nil && resp.StatusCode == http.StatusConflict {
		return ctx.Err() == nil, ctx.Err()
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}

// backoffRetryAfter waits what Retry-After says on 409, 429 and 503, up to hi, and
// otherwise a random time up to lo·2^attempt, capped at hi (full jitter).
func backoffRetryAfter(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil {
		switch resp.StatusCode {
		case http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			if d, ok := parseRetryAfter(resp.Header.Get("Retry-After")); ok {
				return min(d, hi)
			}
		}
	}
	ceiling := hi
	if attempt < 32 {
		ceiling = min(hi, lo<<attempt)
	}
	return rand.N(ceiling + 1)
}

// parseRetryAfter reads Retry-After as delay-seconds or as an HTTP date.
func parseRetryAfter(v string) (time.Duration, bool) {
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0), true
	}
	return 0, false
}

// newStripeClient is stripe-go for an idemflow service at url, retrying for at least
// patience. stripe-go never reads Retry-After: it waits 0.5 s × (1 + n²) before its
// retry n+1, at most 5 s, less up to a quarter of jitter. So it must be allowed enough
// retries to outlast a lease left by a crashed server (30 s by default), plus the time
// the service takes to come back and finish the operation.
func newStripeClient(apiKey, url string, patience time.Duration) *stripe.Client {
	retries := stripeRetriesFor(patience)
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient(apiKey, stripe.WithBackends(backends))
}

// stripeRetriesFor is how many retries keep stripe-go trying for at least d: its
// waits are at least 0.375 s, 0.75 s, 1.875 s, then 3.75 s each.
func stripeRetriesFor(d time.Duration) int64 {
	waits := []time.Duration{375 * time.Millisecond, 750 * time.Millisecond, 1875 * time.Millisecond}
	var n int64
	for ; d > 0; n++ {
		if n < int64(len(waits)) {
			d -= waits[n]
		} else {
			d -= 3750 * time.Millisecond
		}
	}
	return n
}

// outcome is how one sender ended: the last answer it got, or the error it gave up
// with.
type outcome struct {
	status int
	body   string
	err    error
}

// sender sends the charge under (account, key) to base until its client gives up.
type sender func(ctx context.Context, base, account, key string) outcome

const (
	recipeKeys  = 40
	recipeLease = 5 * time.Second
)

// TestClientRecipes runs each client recipe of docs/API.md, and the same client on its
// default settings as a control, against the charges service: 40 keys, two senders per
// key started together, and the server SIGKILLed while the provider holds calls, then
// started again on its address. With a recipe, every sender gets the charge's answer
// and the provider makes one payment per key. The control's figure is logged, not
// asserted: it depends on timing.
func TestClientRecipes(t *testing.T) {
	t.Parallel()
	t.Run("RetryableHTTP", func(t *testing.T) {
		t.Parallel()
		client := newRetryingClient()
		s, got := overlapWithKill(t, "acct_retryable", retryableSender(client), nil)
		s.requireAllAnswered(t, "acct_retryable", got)
	})
	t.Run("RetryableHTTPDefaults", func(t *testing.T) {
		t.Parallel()
		client := retryablehttp.NewClient()
		client.Logger = nil
		_, got := overlapWithKill(t, "acct_retryable", retryableSender(client), nil)
		logControl(t, "go-retryablehttp defaults", got)
	})
	t.Run("StripeGo", func(t *testing.T) {
		t.Parallel()
		s, got := overlapWithKill(t, "sk_test_recipe", stripeSender(func(url string) *stripe.Client {
			return newStripeClient("sk_test_recipe", url, recipeLease+time.Minute)
		}), stripeFront)
		s.requireAllAnswered(t, "sk_test_recipe", got)
	})
	t.Run("StripeGoDefaults", func(t *testing.T) {
		t.Parallel()
		_, got := overlapWithKill(t, "sk_test_defaults", stripeSender(func(url string) *stripe.Client {
			backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{URL: stripe.String(url),
				LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
			return stripe.NewClient("sk_test_defaults", stripe.WithBackends(backends))
		}), stripeFront)
		logControl(t, "stripe-go defaults", got)
	})
}

func retryableSender(client *retryablehttp.Client) sender {
	return func(ctx context.Context, base, account, key string) outcome {
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", []byte(body))
		if err != nil {
			return outcome{err: err}
		}
		req.Header.Set("Authorization", "Bearer "+account)
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return outcome{err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return outcome{status: resp.StatusCode, body: string(b), err: err}
	}
}

// stripeSender creates the charge with stripe-go's V1Charges.Create; the answer's body
// is the charge as stripe-go decoded it (its id and status).
func stripeSender(newClient func(url string) *stripe.Client) sender {
	var (
		mu      sync.Mutex
		clients = map[string]*stripe.Client{}
	)
	return func(ctx context.Context, base, account, key string) outcome {
		mu.Lock()
		sc, ok := clients[base]
		if !ok {
			sc = newClient(base)
			clients[base] = sc
		}
		mu.Unlock()
		params := &stripe.ChargeCreateParams{Amount: stripe.Int64(1299), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}}
		params.SetIdempotencyKey(key)
		ch, err := sc.V1Charges.Create(ctx, params)
		if err != nil {
			return outcome{err: err}
		}
		return outcome{status: ch.LastResponse.StatusCode, body: ch.ID + " " + string(ch.Status)}
	}
}

// stripeFront serves a Stripe-shaped API in front of the charges server at api: it
// turns stripe-go's form-encoded POST /v1/charges into the example's JSON and passes
// everything else (Authorization, Idempotency-Key, the answer) through. While the
// server is down it drops the client's connection, as a dead server would.
func stripeFront(t *testing.T, api string) string {
	target, err := url.Parse(api)
	require.NoError(t, err)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			if err := r.In.ParseForm(); err == nil && r.In.PostForm.Has("amount") {
				amount, _ := strconv.ParseInt(r.In.PostForm.Get("amount"), 10, 64)
				b, _ := json.Marshal(map[string]any{"amount": amount, "currency": r.In.PostForm.Get("currency"),
					"source": r.In.PostForm.Get("source")})
				r.Out.Body = io.NopCloser(bytes.NewReader(b))
				r.Out.ContentLength = int64(len(b))
				r.Out.Header.Set("Content-Type", "application/json")
			}
		},
		ErrorHandler: func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) },
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	return front.URL
}

// overlapWithKill starts the charges stack with a slow provider, sends recipeKeys
// keys from two senders each, one key after another, has the server SIGKILL itself the first time a charge
// is about to commit its finalize phase (CHARGES_KILL_AT: other charges are then in
// their provider call, and that one is surely unfinished), starts it again on the same
// address, and returns every sender's outcome by key. front, when not nil, puts a
// front end before the server.
func overlapWithKill(t *testing.T, account string, send sender, front func(*testing.T, string) string) (*stack, map[string][]outcome) {
	s := &stack{db: direct(t)}
	s.provider = run(t, nil, "provider", "-addr", "127.0.0.1:0", "-latency", "300ms")
	addr := freeAddr(t)
	lease := "-lease=" + recipeLease.String()
	s.server = s.serve(t, []string{"CHARGES_KILL_AT=" + chargeflow.PhaseFinalize + "/before-commit"}, "-addr", addr, lease)
	base := s.server.url
	if front != nil {
		base = front(t, base)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	got := make(map[string][]outcome, recipeKeys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Keys start 25 ms apart (a schedule, not synchronisation): the first ones are in
	// flight when the server dies, later ones meet it down or restarted.
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for i := range recipeKeys {
		if i > 0 {
			<-tick.C
		}
		key := fmt.Sprintf("recipe-%02d", i)
		for range 2 {
			wg.Go(func() {
				o := send(ctx, base, account, key)
				mu.Lock()
				got[key] = append(got[key], o)
				mu.Unlock()
			})
		}
	}
	select {
	case <-s.server.done:
		require.Equal(t, -1, s.server.exitCode(), "the server was killed by a signal")
	case <-ctx.Done():
		t.Fatal("the server never reached its kill point")
	}
	s.server = s.serve(t, nil, "-addr", addr, lease)
	wg.Wait()
	taken := s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope = $1 AND lock_version > 1`, account)
	t.Logf("keys taken over after the kill: %d of %d", taken, recipeKeys)
	return s, got
}

// requireAllAnswered checks that every sender of every key got the charge, both the
// same one, and that each key charged once.
func (s *stack) requireAllAnswered(t *testing.T, account string, got map[string][]outcome) {
	t.Helper()
	require.Len(t, got, recipeKeys)
	for key, outs := range got {
		require.Len(t, outs, 2)
		for _, o := range outs {
			require.NoError(t, o.err, "%s: a sender was left with no answer", key)
			require.Equal(t, http.StatusCreated, o.status, "%s: %s", key, o.body)
		}
		require.Equal(t, outs[0].body, outs[1].body, "%s: both senders got the same charge", key)
		s.requireCharged(t, account, key)
	}
	require.Equal(t, recipeKeys, s.stats(t).Payments, "one provider payment per key")
	require.Positive(t, s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope = $1 AND lock_version > 1`, account),
		"the kill left keys that a retry had to take over")
}

// logControl logs how many keys no sender got an answer for, and how many senders
// were left without one.
func logControl(t *testing.T, name string, got map[string][]outcome) {
	keys, senders := 0, 0
	var sample outcome
	for _, outs := range got {
		answered := false
		for _, o := range outs {
			if o.err == nil && o.status == http.StatusCreated {
				answered = true
			} else {
				senders++
				sample = o
			}
		}
		if !answered {
			keys++
		}
	}
	t.Logf("%s: %d of %d keys unanswered (no sender got the charge); %d of %d senders unanswered; one ended with status=%d err=%v",
		name, keys, len(got), senders, 2*len(got), sample.status, sample.err)
}

// freeAddr returns a loopback address no one listens on now, for a server that must
// come back on the same address after a kill.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestBackoffRetryAfter checks the go-retryablehttp recipe's waits: Retry-After in
// seconds and as a date on 409, 429 and 503, capped; full jitter otherwise.
func TestBackoffRetryAfter(t *testing.T) {
	t.Parallel()
	answer := func(status int, retryAfter string) *http.Response {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		return &http.Response{StatusCode: status, Header: h}
	}
	for _, status := range []int{http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		require.Equal(t, 7*time.Second, backoffRetryAfter(time.Second, time.Minute, 0, answer(status, "7")), status)
		require.Equal(t, 30*time.Second, backoffRetryAfter(time.Second, 30*time.Second, 0, answer(status, "120")), "capped")
		at := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
		d := backoffRetryAfter(time.Second, 2*time.Hour, 0, answer(status, at))
		require.InDelta(t, float64(time.Hour), float64(d), float64(2*time.Second), "an HTTP date")
	}
	for attempt := range 5 {
		d := backoffRetryAfter(time.Second, time.Minute, attempt, answer(http.StatusBadGateway, "7"))
		require.LessOrEqual(t, d, time.Second<<attempt, "full jitter, Retry-After is not read on 502")
		require.GreaterOrEqual(t, d, time.Duration(0))
	}
	require.LessOrEqual(t, backoffRetryAfter(time.Second, 3*time.Second, 40, nil), 3*time.Second)
}
