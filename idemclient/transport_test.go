package idemclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const chargeBody = `{"amount":1299,"currency":"usd"}`

func TestRetryAfter(t *testing.T) {
	t.Parallel()

	t.Run("Seconds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0,
			step{status: 503, header: ra("3")},
			step{status: 201, body: "ok"})
		resp, body, err := b.post(t, context.Background(), "k1", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, "ok", body)
		require.Equal(t, []time.Duration{3 * time.Second}, b.clock.waits())
		require.Len(t, b.srv.attempts(), 2)
	})

	t.Run("HTTPDate", func(t *testing.T) {
		t.Parallel()
		at := clockStart.Add(7 * time.Second).Format(http.TimeFormat)
		b := setup(t, nil, 0,
			step{status: 429, header: ra(at)},
			step{status: 201})
		resp, _, err := b.post(t, context.Background(), "k1", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, []time.Duration{7 * time.Second}, b.clock.waits())
	})

	t.Run("DateInThePastBacksOff", func(t *testing.T) {
		t.Parallel()
		at := clockStart.Add(-time.Hour).Format(http.TimeFormat)
		b := setup(t, nil, 0.5,
			step{status: 503, header: ra(at)},
			step{status: 201})
		_, _, err := b.post(t, context.Background(), "k1", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, []time.Duration{BackoffMinDefault / 2}, b.clock.waits())
	})

	t.Run("JitterAddsUpToATenth", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0.5,
			step{status: 409, header: ra("10")},
			step{status: 201})
		_, _, err := b.post(t, context.Background(), "k1", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, []time.Duration{10*time.Second + 500*time.Millisecond}, b.clock.waits())
	})

	t.Run("LongerThanTheBudgetLeftEndsAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &Config{MaxElapsed: time.Minute}, 0,
			step{status: 503, header: ra("3600")})
		_, _, err := b.post(t, context.Background(), "k1", strings.NewReader(chargeBody))
		var ex *ExhaustedError
		require.ErrorAs(t, err, &ex)
		require.Equal(t, ExhaustedError{Key: "k1", Attempts: 1, Status: 503, RetryAfter: time.Hour}, *ex)
		require.ErrorIs(t, err, ErrExhausted)
		require.Empty(t, b.clock.waits(), "no wait the budget cannot afford")
	})
}

// TestConflictStorm: a key held by a long first attempt answers 409 again and again;
// the client keeps the key, honours every Retry-After, and ends with the answer.
func TestConflictStorm(t *testing.T) {
	t.Parallel()
	var steps []step
	for range 12 {
		steps = append(steps, step{status: 409, header: ra("1"), body: `{"type":"key-in-progress"}`})
	}
	steps = append(steps, step{status: 201, header: map[string]string{ReplayedHeader: "true"}, body: `{"id":"ch_1"}`})
	b := setup(t, nil, 0, steps...)
	resp, body, err := b.post(t, context.Background(), "storm", strings.NewReader(chargeBody))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	require.True(t, Replayed(resp))
	require.Equal(t, `{"id":"ch_1"}`, body)
	got := b.srv.attempts()
	require.Len(t, got, 13)
	for _, a := range got {
		require.Equal(t, "storm", a.key, "one key on every attempt")
	}
	require.Len(t, b.clock.waits(), 12)
	for _, w := range b.clock.waits() {
		require.Equal(t, time.Second, w)
	}
	for i, ev := range b.retries() {
		require.Equal(t, RetryEvent{Key: "storm", Attempt: i + 1, Status: 409, Wait: time.Second}, ev)
	}
}

func TestGoneEndsWithTypedError(t *testing.T) {
	t.Parallel()
	problem := `{"type":"https://example.com/docs/API.md#key-dead-lettered","title":"Gone","status":410}`
	b := setup(t, nil, 0, step{status: 410, header: map[string]string{"Content-Type": "application/problem+json"}, body: problem})
	resp, _, err := b.post(t, context.Background(), "dead", strings.NewReader(chargeBody))
	require.Nil(t, resp)
	require.ErrorIs(t, err, ErrDeadLettered)
	var gone *DeadLetteredError
	require.ErrorAs(t, err, &gone)
	require.Equal(t, "dead", gone.Key)
	require.Equal(t, problem, string(gone.Body))
	require.Equal(t, "application/problem+json", gone.Header.Get("Content-Type"))
	require.Len(t, b.srv.attempts(), 1, "never retried")
	require.Empty(t, b.clock.waits())
}

func TestFinalAnswersAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, status := range []int{200, 201, 204, 303, 400, 401, 402, 404, 405, 413, 422, 501} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, 0, step{status: status, body: "answer"})
			resp, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
			require.NoError(t, err)
			require.Equal(t, status, resp.StatusCode)
			require.False(t, Replayed(resp))
			require.Len(t, b.srv.attempts(), 1)
			require.Empty(t, b.clock.waits())
		})
	}
}

func TestTransientAnswersBackOff(t *testing.T) {
	t.Parallel()
	for _, status := range []int{408, 500, 502, 504} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &Config{BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}, 0.5,
				step{status: status}, step{status: status}, step{status: status}, step{status: status},
				step{status: status}, step{status: status}, step{status: 201})
			resp, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
			require.NoError(t, err)
			require.Equal(t, 201, resp.StatusCode)
			// Half (the random number) of 100, 200, 400, 800 ms, then of the 1 s cap.
			ms := time.Millisecond
			require.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}, b.clock.waits())
		})
	}
	t.Run("Other5xxWithRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 507, header: ra("2")}, step{status: 201})
		resp, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, []time.Duration{2 * time.Second}, b.clock.waits())
	})
}

func TestNetworkErrorsAreRetried(t *testing.T) {
	t.Parallel()
	t.Run("DroppedConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{drop: true}, step{status: 201})
		resp, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		ev := b.retries()
		require.Len(t, ev, 1)
		require.Equal(t, 0, ev[0].Status)
		require.Error(t, ev[0].Err)
	})
	t.Run("AttemptTimeout", func(t *testing.T) {
		t.Parallel()
		// The first attempt never answers; the attempt timeout ends it (fired once the
		// server holds the attempt, not by the clock) and the second attempt gets the
		// answer.
		b := setup(t, &Config{AttemptTimeout: 20 * time.Millisecond}, 0, step{hang: true}, step{status: 201})
		b.timeoutAttempt(1)
		resp, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		ev := b.retries()
		require.Len(t, ev, 1)
		require.ErrorIs(t, ev[0].Err, errAttemptTimeout)
	})
	t.Run("ServerGone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &Config{MaxAttempts: 3}, 0.5)
		b.srv.Close()
		_, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		var ex *ExhaustedError
		require.ErrorAs(t, err, &ex)
		require.Equal(t, 3, ex.Attempts)
		require.Equal(t, 0, ex.Status)
		require.Error(t, ex.Err, "the last attempt's network error")
		require.Len(t, b.clock.waits(), 2)
	})
}

// onlyReader hides a reader's type, so http.NewRequest sets no GetBody.
type onlyReader struct{ io.Reader }

func TestBodyReplayedByteForByte(t *testing.T) {
	t.Parallel()
	payload := append([]byte(`{"amount":1299,"note":"`), 0xff, 0x00, '\n')
	payload = append(payload, bytes.Repeat([]byte("x"), 100_000)...)
	payload = append(payload, `"}`...)
	steps := []step{{status: 503, header: ra("1")}, {drop: true}, {status: 500}, {status: 201}}
	for name, body := range map[string]func() io.Reader{
		"WithGetBody":    func() io.Reader { return bytes.NewReader(payload) },
		"WithoutGetBody": func() io.Reader { return onlyReader{bytes.NewReader(payload)} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, 0, steps...)
			resp, _, err := b.post(t, context.Background(), "k", body())
			require.NoError(t, err)
			require.Equal(t, 201, resp.StatusCode)
			got := b.srv.attempts()
			require.Len(t, got, 4)
			for i, a := range got {
				require.True(t, bytes.Equal(payload, a.body), "attempt %d's body differs", i+1)
			}
		})
	}
}

func TestContextIsRespected(t *testing.T) {
	t.Parallel()
	t.Run("CancelledWhileWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 503, header: ra("30")})
		ctx, cancel := context.WithCancel(context.Background())
		b.clock.onSleep = func(int) { cancel() }
		_, _, err := b.post(t, ctx, "k", strings.NewReader(chargeBody))
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "waiting to retry", "the wait itself ends with the context")
		require.Len(t, b.srv.attempts(), 1, "no attempt after the context ended")
	})
	t.Run("CancelledDuringAnAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{hang: true})
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-b.srv.arrived; cancel() }()
		_, _, err := b.post(t, ctx, "k", strings.NewReader(chargeBody))
		require.ErrorIs(t, err, context.Canceled)
		require.Len(t, b.srv.attempts(), 1)
		require.Empty(t, b.clock.waits())
	})
	t.Run("DeadlineWhileWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 409, header: ra("1")})
		ctx, cancel := context.WithCancelCause(context.Background())
		b.clock.onSleep = func(int) { cancel(context.DeadlineExceeded) }
		_, _, err := b.post(t, ctx, "k", strings.NewReader(chargeBody))
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

func TestBounds(t *testing.T) {
	t.Parallel()
	t.Run("Attempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &Config{MaxAttempts: 4}, 0,
			step{status: 409, header: ra("1")}, step{status: 409, header: ra("1")},
			step{status: 409, header: ra("1")}, step{status: 409, header: ra("2")})
		_, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		var ex *ExhaustedError
		require.ErrorAs(t, err, &ex)
		require.Equal(t, ExhaustedError{Key: "k", Attempts: 4, Elapsed: 3 * time.Second, Status: 409, RetryAfter: 2 * time.Second}, *ex)
		require.Len(t, b.srv.attempts(), 4)
	})
	t.Run("Time", func(t *testing.T) {
		t.Parallel()
		// 10 s allowed, 4 s asked each time: attempts at 0, 4 and 8 s; at 8 s only 2 s
		// are left, less than the 4 s asked.
		b := setup(t, &Config{MaxElapsed: 10 * time.Second}, 0,
			step{status: 503, header: ra("4")}, step{status: 503, header: ra("4")}, step{status: 503, header: ra("4")})
		_, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		var ex *ExhaustedError
		require.ErrorAs(t, err, &ex)
		require.Equal(t, 3, ex.Attempts)
		require.Equal(t, 8*time.Second, ex.Elapsed)
		require.Equal(t, []time.Duration{4 * time.Second, 4 * time.Second}, b.clock.waits())
	})
	t.Run("BackoffCutToTheTimeLeft", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &Config{MaxElapsed: 300 * time.Millisecond, BackoffMin: time.Second, BackoffMax: time.Second}, 0.9,
			step{status: 502}, step{status: 502})
		_, _, err := b.post(t, context.Background(), "k", strings.NewReader(chargeBody))
		require.ErrorIs(t, err, ErrExhausted)
		require.Equal(t, []time.Duration{300 * time.Millisecond}, b.clock.waits())
		require.Len(t, b.srv.attempts(), 2)
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	t.Run("FromContextBare", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 201})
		_, _, err := b.post(t, context.Background(), "sub_123:2026-10", nil)
		require.NoError(t, err)
		require.Equal(t, "sub_123:2026-10", b.srv.attempts()[0].key)
	})
	t.Run("FromContextQuoted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 201})
		_, _, err := b.post(t, context.Background(), `order "17" \ a`, nil)
		require.NoError(t, err)
		require.Equal(t, `"order \"17\" \\ a"`, b.srv.attempts()[0].key)
	})
	t.Run("HeaderSentAsItIs", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 503}, step{status: 201})
		req, err := http.NewRequest(http.MethodPost, b.srv.URL, strings.NewReader(chargeBody))
		require.NoError(t, err)
		req.Header.Set(KeyHeader, `"from the header"`)
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		for _, a := range b.srv.attempts() {
			require.Equal(t, `"from the header"`, a.key)
		}
	})
	t.Run("NoKeyPassesThroughOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0, step{status: 503, header: ra("1")})
		resp, _, err := b.post(t, context.Background(), "", strings.NewReader(chargeBody))
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Len(t, b.srv.attempts(), 1)
		require.Empty(t, b.srv.attempts()[0].key)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, 0)
		for name, mk := range map[string]func() *http.Request{
			"InvalidContextKey": func() *http.Request {
				req, _ := http.NewRequestWithContext(WithKey(context.Background(), "tab\there"), http.MethodPost, b.srv.URL, nil)
				return req
			},
			"TwoKeys": func() *http.Request {
				req, _ := http.NewRequestWithContext(WithKey(context.Background(), "one"), http.MethodPost, b.srv.URL, nil)
				req.Header.Set(KeyHeader, "two")
				return req
			},
			"TwoHeaders": func() *http.Request {
				req, _ := http.NewRequest(http.MethodPost, b.srv.URL, nil)
				req.Header.Add(KeyHeader, "one")
				req.Header.Add(KeyHeader, "two")
				return req
			},
		} {
			_, err := b.client.Do(mk())
			require.ErrorIs(t, err, ErrInvalidKey, name)
		}
		require.Empty(t, b.srv.attempts(), "nothing sent")
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	d := (*Config)(nil).WithDefaults()
	require.Equal(t, &Config{MaxAttempts: MaxAttemptsDefault, MaxElapsed: MaxElapsedDefault, AttemptTimeout: AttemptTimeoutDefault,
		BackoffMin: BackoffMinDefault, BackoffMax: BackoffMaxDefault}, d)
	off := &Config{AttemptTimeout: -1}
	require.Equal(t, off.WithDefaults(), off.WithDefaults().WithDefaults())
	require.Equal(t, time.Duration(-1), off.WithDefaults().AttemptTimeout)
	for _, bad := range []*Config{
		{MaxAttempts: -1}, {MaxElapsed: -time.Second}, {AttemptTimeout: -2},
		{BackoffMin: -1}, {BackoffMin: time.Minute, BackoffMax: time.Second},
	} {
		_, err := NewTransport(nil, bad)
		require.Error(t, err, "%+v", bad)
	}
	_, err := http.NewRequest(http.MethodPost, "ftp://example.com", nil)
	require.NoError(t, err)
	tr, err := NewTransport(nil, nil)
	require.NoError(t, err)
	req, _ := http.NewRequestWithContext(WithKey(context.Background(), "k"), http.MethodPost, "ftp://example.com", nil)
	_, err = tr.RoundTrip(req)
	require.ErrorContains(t, err, "unsupported URL scheme")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{
		"0":   0,
		"120": 2 * time.Minute,
		clockStart.Add(90 * time.Second).Format(http.TimeFormat):  90 * time.Second,
		clockStart.Add(-90 * time.Second).Format(http.TimeFormat): 0,
		"99999999999999999999": time.Duration(1<<63 - 1),
	} {
		got, ok := parseRetryAfter(v, clockStart)
		require.True(t, ok, v)
		require.Equal(t, want, got, v)
	}
	for _, v := range []string{"", "-1", "1.5", "soon", "+3"} {
		_, ok := parseRetryAfter(v, clockStart)
		require.False(t, ok, v)
	}
}

func TestNoRetryEventOnSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, 0, step{status: 201})
	_, _, err := b.post(t, context.Background(), "k", nil)
	require.NoError(t, err)
	require.Empty(t, b.retries())
	require.False(t, errors.Is(err, ErrExhausted))
}
