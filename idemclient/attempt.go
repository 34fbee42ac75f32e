package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// run is one request's attempts.
type run struct {
	t     *Transport
	req   *http.Request
	key   string
	body  func() (io.ReadCloser, error) // nil: no body
	start time.Time
}

// verdict is what an attempt's outcome means for the request.
type verdict int

const (
	final   verdict = iota // return the answer
	retry                  // wait, then send again
	gone                   // 410: end with a *DeadLetteredError
	stopped                // end with outcome.err
)

// outcome is one attempt's result, judged once.
type outcome struct {
	verdict    verdict
	resp       *http.Response // final: the answer, its body open
	status     int            // the answer's status, 0 without one
	retryAfter time.Duration  // the answer's Retry-After, 0 without one
	header     http.Header    // gone: the answer's header
	body       []byte         // gone: the answer's body
	err        error          // retry: why, when there was no answer; stopped: the error
}

// loop sends attempts until one is final or the policy or the context ends the run.
func (r *run) loop() (*http.Response, error) {
	ctx := r.req.Context()
	for attempt := 1; ; attempt++ {
		o := r.attempt()
		switch o.verdict {
		case final:
			return o.resp, nil
		case gone:
			return nil, &DeadLetteredError{Key: r.key, Header: o.header, Body: o.body}
		case stopped:
			return nil, o.err
		}
		wait, err := r.plan(attempt, o)
		if err != nil {
			return nil, err
		}
		if r.t.cfg.OnRetry != nil {
			r.t.cfg.OnRetry(ctx, RetryEvent{Key: r.key, Attempt: attempt, Status: o.status, Err: o.err, Wait: wait})
		}
		if err := r.t.sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("idemclient: key %q: waiting to retry: %w", r.key, err)
		}
	}
}

// plan returns the wait before the attempt after attempt, or an *ExhaustedError when
// the policy allows none.
func (r *run) plan(attempt int, o outcome) (time.Duration, error) {
	cfg := r.t.cfg
	elapsed := r.t.now().Sub(r.start)
	left := cfg.MaxElapsed - elapsed
	if attempt >= cfg.MaxAttempts || left <= 0 || o.retryAfter > left {
		return 0, &ExhaustedError{Key: r.key, Attempts: attempt, Elapsed: elapsed, Status: o.status, RetryAfter: o.retryAfter, Err: o.err}
	}
	if o.retryAfter > 0 {
		extra := time.Duration(r.t.rand() * float64(min(o.retryAfter/10, left-o.retryAfter)))
		return o.retryAfter + extra, nil
	}
	return min(r.backoff(attempt), left), nil
}

// backoff is the full-jitter backoff after the n-th attempt: uniformly random in
// [0, min(BackoffMax, BackoffMin·2ⁿ⁻¹)).
func (r *run) backoff(n int) time.Duration {
	ceiling := r.t.cfg.BackoffMin
	for i := 1; i < n && ceiling < r.t.cfg.BackoffMax; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, r.t.cfg.BackoffMax)
	return time.Duration(r.t.rand() * float64(ceiling))
}

// attempt sends one attempt and judges its outcome. Only a final outcome leaves a
// response body open; closing it ends the attempt's context.
func (r *run) attempt() outcome {
	parent := r.req.Context()
	ctx, cancel := context.WithCancelCause(parent)
	out := r.req.Clone(ctx)
	if out.Header.Get(KeyHeader) == "" {
		out.Header.Set(KeyHeader, headerValue(r.key))
	}
	if r.body != nil {
		b, err := r.body()
		if err != nil {
			cancel(nil)
			return outcome{verdict: stopped, err: fmt.Errorf("idemclient: key %q: replay the request body: %w", r.key, err)}
		}
		out.Body, out.GetBody = b, r.body
	}
	var stop func() bool
	if d := r.t.cfg.AttemptTimeout; d > 0 {
		stop = r.t.after(d, func() { cancel(errAttemptTimeout) })
	}
	resp, err := r.t.next.RoundTrip(out)
	if stop != nil && !stop() && err == nil {
		// The timeout fired as the headers came: the body is cut off, so this
		// answer cannot be read. Count it as a timeout.
		_ = resp.Body.Close()
		resp, err = nil, errAttemptTimeout
	}
	if err != nil {
		cancel(nil)
		return r.judgeError(parent, ctx, err)
	}
	o := r.judge(resp)
	if o.verdict == final {
		resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
		return o
	}
	cancel(nil)
	return o
}

// judgeError judges an attempt that got no answer.
func (r *run) judgeError(parent, ctx context.Context, err error) outcome {
	if parent.Err() != nil {
		return outcome{verdict: stopped, err: fmt.Errorf("idemclient: key %q: %w", r.key, context.Cause(parent))}
	}
	if errors.Is(err, errAttemptTimeout) || errors.Is(context.Cause(ctx), errAttemptTimeout) {
		return outcome{verdict: retry, err: fmt.Errorf("%w after %s", errAttemptTimeout, r.t.cfg.AttemptTimeout)}
	}
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) {
		return outcome{verdict: stopped, err: fmt.Errorf("idemclient: key %q: %w", r.key, err)}
	}
	return outcome{verdict: retry, err: err}
}

// judge judges an attempt's answer; it reads and closes the body of any answer but a
// final one.
func (r *run) judge(resp *http.Response) outcome {
	o := outcome{verdict: final, resp: resp, status: resp.StatusCode}
	ra, hasRA := parseRetryAfter(resp.Header.Get("Retry-After"), r.t.now())
	switch s := resp.StatusCode; {
	case s == http.StatusGone:
		o.verdict, o.header = gone, resp.Header
		o.body, _ = io.ReadAll(io.LimitReader(resp.Body, maxKeptBody))
	case s == http.StatusRequestTimeout, s == http.StatusConflict, s == http.StatusTooManyRequests,
		s == http.StatusInternalServerError, s == http.StatusBadGateway, s == http.StatusServiceUnavailable,
		s == http.StatusGatewayTimeout, s >= 500 && s <= 599 && hasRA:
		o.verdict, o.retryAfter = retry, ra
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainedBody))
	default:
		return o
	}
	_ = resp.Body.Close()
	o.resp = nil
	return o
}

const (
	maxKeptBody    = 64 << 10 // of a 410's problem document
	maxDrainedBody = 64 << 10 // read from a retried answer so its connection is reused
)

// parseRetryAfter reads a Retry-After field: delay-seconds or an HTTP-date, the latter
// relative to now (a date in the past is 0). ok is false when v is empty or neither.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64), true // longer than any budget
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// cancelOnClose ends an attempt's context when its answer's body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}
