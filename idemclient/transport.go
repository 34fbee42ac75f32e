package idemclient

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults of Config.
const (
	// MaxAttemptsDefault is Config.MaxAttempts's default: attempts per request, the
	// first included.
	MaxAttemptsDefault = 20
	// MaxElapsedDefault is Config.MaxElapsed's default: no attempt starts later than
	// this after the first began.
	MaxElapsedDefault = 2 * time.Minute
	// AttemptTimeoutDefault is Config.AttemptTimeout's default: how long one attempt may
	// wait for its answer's headers.
	AttemptTimeoutDefault = 30 * time.Second
	// BackoffMinDefault and BackoffMaxDefault are the defaults of Config.BackoffMin and
	// Config.BackoffMax.
	BackoffMinDefault = 100 * time.Millisecond
	BackoffMaxDefault = 10 * time.Second
)

// Config is the retry policy of a Transport. A nil *Config, and every zero field,
// means the default.
type Config struct {
	// MaxAttempts bounds the attempts of one request, the first included. Defaults to
	// MaxAttemptsDefault (20).
	MaxAttempts int
	// MaxElapsed bounds the time of one request's attempts: no attempt starts later than
	// MaxElapsed after the first began, and a Retry-After that ends later is not waited
	// for. An attempt already sent runs to its answer or its AttemptTimeout. Defaults to
	// MaxElapsedDefault (2 minutes). The request's context bounds everything, waits and
	// attempts included (so does http.Client.Timeout).
	MaxElapsed time.Duration
	// AttemptTimeout bounds the wait for one attempt's answer headers; an attempt that
	// times out is retried. -1: no bound but the context's. Defaults to
	// AttemptTimeoutDefault (30 seconds).
	AttemptTimeout time.Duration
	// BackoffMin and BackoffMax shape the wait after an answer without Retry-After: a
	// uniformly random time ("full jitter") up to BackoffMin·2ⁿ⁻¹ after the n-th
	// attempt, at most BackoffMax. Default to BackoffMinDefault (100 ms) and
	// BackoffMaxDefault (10 s).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// OnRetry, when set, is called before each wait for a retry, for logs and metrics,
	// on the goroutine of the request: requests sent at once call it at once.
	OnRetry func(ctx context.Context, ev RetryEvent)
}

// WithDefaults returns a copy of c (nil is allowed) with every zero field set to its
// default. Special values (-1) are kept as written, so calling it twice is the same as
// once.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	out.MaxAttempts = cmp.Or(out.MaxAttempts, MaxAttemptsDefault)
	out.MaxElapsed = cmp.Or(out.MaxElapsed, MaxElapsedDefault)
	out.AttemptTimeout = cmp.Or(out.AttemptTimeout, AttemptTimeoutDefault)
	out.BackoffMin = cmp.Or(out.BackoffMin, BackoffMinDefault)
	out.BackoffMax = cmp.Or(out.BackoffMax, BackoffMaxDefault)
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("idemclient: MaxAttempts %d is below 1", c.MaxAttempts)
	case c.MaxElapsed < 0:
		return fmt.Errorf("idemclient: MaxElapsed %s is negative", c.MaxElapsed)
	case c.AttemptTimeout < 0 && c.AttemptTimeout != -1:
		return fmt.Errorf("idemclient: AttemptTimeout %s is negative; for no bound use -1", c.AttemptTimeout)
	case c.BackoffMin < 0 || c.BackoffMax < 0:
		return fmt.Errorf("idemclient: BackoffMin %s or BackoffMax %s is negative", c.BackoffMin, c.BackoffMax)
	case c.BackoffMin > c.BackoffMax:
		return fmt.Errorf("idemclient: BackoffMin %s is above BackoffMax %s", c.BackoffMin, c.BackoffMax)
	}
	return nil
}

// RetryEvent describes an attempt that will be retried.
type RetryEvent struct {
	// Key is the request's idempotency key.
	Key string
	// Attempt is the number of the attempt that got no final answer, from 1.
	Attempt int
	// Status is its answer's status, 0 when it got none (then Err says why).
	Status int
	Err    error
	// Wait is how long the Transport waits before the next attempt.
	Wait time.Duration
}

// Transport is an http.RoundTripper that sends each request under its idempotency key
// and retries it, with the same key and the same body bytes, until it has a final
// answer. Use it as the Transport of any http.Client, including the one a generated
// API client is given. It is safe for concurrent use.
//
// A request is sent under a key when it carries KeyHeader or its context carries one
// (WithKey); any other request is passed to the next transport once, untouched, since
// retrying a request without a key could run it twice.
//
// Redirects: the key belongs to the operation, and the http.Client above the Transport
// follows redirects as new requests. The final answer of the operation is the redirect
// itself (a 303 See Other is stored and replayed by an idemflow server like any
// answer); following a 301, 302 or 303 is a GET of another resource, which the
// Transport sends once, without the key (it removes the Idempotency-Key header the
// http.Client copies from the first request). A 307 or 308 repeats the same method
// and body at another URI, the same operation: it is sent under the same key and
// retried like the first request. Stop the http.Client from following redirects
// (CheckRedirect returning http.ErrUseLastResponse) to get the redirect itself.
//
// What each answer means:
//   - 408, 409, 429, 500, 502, 503, 504, and any other 5xx with Retry-After: retried
//     after the answer's Retry-After (delay-seconds or an HTTP-date, plus up to a
//     tenth more at random, so that clients told the same time spread out), or else
//     after a backoff with full jitter. A 5xx is never stored by an idemflow server
//     and a 409 means the first attempt still runs, so the same key is safe.
//   - a network error or an attempt timeout: retried after a backoff. TLS certificate
//     errors are not retried.
//   - 410: the server gave up on the key; RoundTrip returns a *DeadLetteredError.
//   - anything else, 2xx, 3xx and 4xx (400, 401, 413 and 422 among them): the final
//     answer, returned as it is. Replayed tells whether it was replayed.
//
// When Config.MaxAttempts or Config.MaxElapsed runs out, or a Retry-After would end
// after MaxElapsed, RoundTrip returns an *ExhaustedError: retry later with the same
// key. When the context ends, it returns the context's error at once.
type Transport struct {
	next http.RoundTripper
	cfg  *Config

	// Test seams: the clock, the wait between attempts, random numbers in [0, 1), the
	// attempt timeout's timer (it calls f after d unless stop, which reports whether it
	// stopped it, comes first).
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	rand  func() float64
	after func(d time.Duration, f func()) (stop func() bool)
}

// NewTransport returns a Transport that sends attempts through next (nil:
// http.DefaultTransport) under cfg's policy (nil: the defaults). It returns an error
// when cfg is not valid.
func NewTransport(next http.RoundTripper, cfg *Config) (*Transport, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if next == nil {
		next = http.DefaultTransport
	}
	return &Transport{next: next, cfg: cfg, now: time.Now, sleep: sleep, rand: rand.Float64, after: afterFunc}, nil
}

func afterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// RoundTrip sends req under its key until it has a final answer; see Transport. The
// errors it returns: ErrInvalidKey (nothing sent), *DeadLetteredError,
// *ExhaustedError, the context's error, or the error of reading req's body.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Response != nil && !repeatsOperation(req) {
		return t.next.RoundTrip(withoutKey(req))
	}
	key, keyed, err := requestKey(req)
	if err == nil && !keyed {
		return t.next.RoundTrip(req)
	}
	if err == nil && req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		err = fmt.Errorf("idemclient: unsupported URL scheme %q", req.URL.Scheme)
	}
	var body func() (io.ReadCloser, error)
	if err == nil {
		body, err = replayable(req)
	} else if req.Body != nil {
		_ = req.Body.Close()
	}
	if err != nil {
		return nil, err
	}
	r := &run{t: t, req: req, key: key, body: body, start: t.now()}
	return r.loop()
}

// repeatsOperation reports whether req, a request an http.Client made to follow a
// redirect (req.Response is set), repeats the operation of the request it follows:
// only a 307 or 308 does (the same method and body to another URI), at every hop
// back to the first request that can be traced (Response.Request). After a 301, 302
// or 303 the http.Client sends a GET without the body: a read of another resource,
// not the operation, which must not carry the operation's key.
func repeatsOperation(req *http.Request) bool {
	for r := req; r != nil && r.Response != nil; r = r.Response.Request {
		if s := r.Response.StatusCode; s != http.StatusTemporaryRedirect && s != http.StatusPermanentRedirect {
			return false
		}
	}
	return true
}

// withoutKey returns req without KeyHeader (an http.Client copies the first request's
// headers onto every redirect), or req itself when it has none.
func withoutKey(req *http.Request) *http.Request {
	if len(req.Header.Values(KeyHeader)) == 0 {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Del(KeyHeader)
	return out
}

// requestKey returns the request's key: its KeyHeader, sent as it is, or the key of
// its context. keyed is false when it has neither.
func requestKey(req *http.Request) (key string, keyed bool, err error) {
	fields := req.Header.Values(KeyHeader)
	ctxKey, inCtx := KeyFromContext(req.Context())
	if inCtx {
		if err := ValidateKey(ctxKey); err != nil {
			return "", false, err
		}
	}
	switch {
	case len(fields) > 1:
		return "", false, fmt.Errorf("%w: %d %s header fields", ErrInvalidKey, len(fields), KeyHeader)
	case len(fields) == 1 && inCtx && fields[0] != ctxKey && fields[0] != headerValue(ctxKey):
		return "", false, fmt.Errorf("%w: the %s header %q is not the context's key %q", ErrInvalidKey, KeyHeader, fields[0], ctxKey)
	case len(fields) == 1:
		return fields[0], true, nil
	case inCtx:
		return ctxKey, true, nil
	}
	return "", false, nil
}

// replayable returns a function that gives each attempt the request's body, the same
// bytes every time: req.GetBody when it is set, else the body read once into memory.
// It closes req.Body. It returns nil for a request without a body.
func replayable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("idemclient: read the request body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

// Replayed reports whether resp is an answer replayed from an earlier attempt under
// the same key (ReplayedHeader is "true"), rather than the answer of the attempt that
// ran the operation.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(ReplayedHeader) == "true"
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-tm.C:
		return nil
	}
}

// errAttemptTimeout is the cause of an attempt's context cancelled by AttemptTimeout.
var errAttemptTimeout = errors.New("idemclient: attempt timed out")
