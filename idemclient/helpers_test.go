package idemclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// step is a scripted server's answer to one attempt.
type step struct {
	status int
	header map[string]string
	body   string
	hang   bool // wait until the attempt's request is cancelled, answer nothing
	drop   bool // close the connection without an answer
}

// received is what the scripted server got in one attempt.
type received struct {
	key           string
	body          []byte
	contentLength int64
}

// scripted is a local HTTP server that answers attempt i with steps[i] and records
// what each attempt carried.
type scripted struct {
	*httptest.Server
	t     *testing.T
	steps []step
	mu    sync.Mutex
	got   []received
	// arrived gets each attempt's number, from 1, as its request is read.
	arrived chan int
}

func newScripted(t *testing.T, steps ...step) *scripted {
	s := &scripted{t: t, steps: steps, arrived: make(chan int, 100)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	require.NoError(s.t, err)
	s.mu.Lock()
	s.got = append(s.got, received{key: r.Header.Get(KeyHeader), body: body, contentLength: r.ContentLength})
	n := len(s.got)
	s.mu.Unlock()
	s.arrived <- n
	if n > len(s.steps) {
		s.t.Errorf("attempt %d, but the script has %d steps", n, len(s.steps))
		w.WriteHeader(http.StatusTeapot)
		return
	}
	st := s.steps[n-1]
	switch {
	case st.hang:
		<-r.Context().Done()
		return
	case st.drop:
		conn, _, err := http.NewResponseController(w).Hijack()
		require.NoError(s.t, err)
		_ = conn.Close()
		return
	}
	for k, v := range st.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(st.status)
	_, _ = io.WriteString(w, st.body)
}

// attempts returns what every attempt so far carried.
func (s *scripted) attempts() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.got...)
}

// fakeClock is the Transport's clock: it moves only when the Transport waits.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// onSleep, when set, runs before each wait with its number, from 1.
	onSleep func(n int)
}

var clockStart = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	n, hook := len(c.sleeps), c.onSleep
	c.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return nil
}

func (c *fakeClock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// bundle is a Transport on a fake clock in front of a scripted server.
type bundle struct {
	srv    *scripted
	tr     *Transport
	client *http.Client
	clock  *fakeClock
	mu     sync.Mutex
	events []RetryEvent
}

// setup builds a bundle. random is the Transport's random number, fixed.
func setup(t *testing.T, cfg *Config, random float64, steps ...step) *bundle {
	t.Helper()
	b := &bundle{srv: newScripted(t, steps...), clock: &fakeClock{now: clockStart}}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.OnRetry = func(ctx context.Context, ev RetryEvent) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.events = append(b.events, ev)
	}
	tr, err := NewTransport(nil, &c)
	require.NoError(t, err)
	tr.now, tr.sleep, tr.rand = b.clock.Now, b.clock.Sleep, func() float64 { return random }
	b.tr, b.client = tr, &http.Client{Transport: tr}
	return b
}

// post sends body under key (when not empty) with ctx and returns the answer with its
// body read, or the error.
func (b *bundle) post(t *testing.T, ctx context.Context, key string, body io.Reader) (*http.Response, string, error) {
	t.Helper()
	if key != "" {
		ctx = WithKey(ctx, key)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/v1/charges", body)
	require.NoError(t, err)
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(got), nil
}

// timeoutAttempt makes the attempt timeout fire for attempt n once the scripted server
// has received it, and for no other attempt: a real timer short enough for a test
// would also end an answered attempt on a slow machine.
func (b *bundle) timeoutAttempt(n int) {
	var calls atomic.Int32
	b.tr.after = func(_ time.Duration, fire func()) func() bool {
		if int(calls.Add(1)) != n {
			return func() bool { return true } // stopped before it fired
		}
		var fired atomic.Bool
		go func() {
			for got := range b.srv.arrived {
				if got == n {
					fired.Store(true)
					fire()
					return
				}
			}
		}()
		return func() bool { return !fired.Load() }
	}
}

func (b *bundle) retries() []RetryEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]RetryEvent(nil), b.events...)
}

// ra is a Retry-After header of s.
func ra(s string) map[string]string { return map[string]string{"Retry-After": s} }
