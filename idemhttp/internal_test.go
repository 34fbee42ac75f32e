package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

func TestAnswerOf(t *testing.T) {
	t.Parallel()
	busy := &phases.Response{Status: 503, Body: []byte("busy")}
	// released and fail are results as the engine makes them: released after a
	// transient failure, failed with a cause.
	released := func(te *workflow.TransientError) *workflow.Result {
		return &workflow.Result{Outcome: workflow.OutcomeReleased, Phase: te.Phase, RetryAfter: te.RetryAfter, Response: te.Response, Err: te}
	}
	fail := func(err error) *workflow.Result { return &workflow.Result{Outcome: workflow.OutcomeFailed, Err: err} }
	cases := []struct {
		name       string
		out        *workflow.Result
		status     int
		retryAfter time.Duration
		pass       bool
	}{
		{"InvalidKey", fail(fmt.Errorf("%w: empty", workflow.ErrInvalidKey)), 400, 0, false},
		{"InvalidRequest", fail(workflow.ErrInvalidRequest), 400, 0, false},
		{"BodyTooLarge", fail(workflow.ErrBodyTooLarge), 413, 0, false},
		{"Mismatch", &workflow.Result{Outcome: workflow.OutcomeMismatch, Err: workflow.ErrMismatch}, 422, 0, false},
		{"InProgress", &workflow.Result{Outcome: workflow.OutcomeInProgress, RetryAfter: 2500 * time.Millisecond,
			Err: &workflow.InProgressError{RetryAfter: 2500 * time.Millisecond}}, 409, 2500 * time.Millisecond, false},
		{"LeaseLost", &workflow.Result{Outcome: workflow.OutcomeLeaseLost, RetryAfter: time.Second,
			Err: fmt.Errorf("%w: %w", workflow.ErrLeaseLost, workflow.ErrLeaseLost)}, 409, time.Second, false},
		{"Shed", &workflow.Result{Outcome: workflow.OutcomeShed, RetryAfter: time.Second,
			Err: &workflow.ShedError{RetryAfter: time.Second, Err: workflow.ErrOverloaded}}, 503, time.Second, false},
		{"ResponseTooLarge", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: workflow.ErrResponseTooLarge}), 500, 0, false},
		{"DeadLettered", fail(fmt.Errorf("%w: gave up", workflow.ErrDeadLettered)), 410, 0, false},
		{"DeadLetteredNow", &workflow.Result{Outcome: workflow.OutcomeDeadLettered,
			Err: fmt.Errorf("%w: %v", workflow.ErrDeadLettered, workflow.ErrUnstorable)}, 410, 0, false},
		{"Refused", &workflow.Result{Outcome: workflow.OutcomeDeadLettered, Err: workflow.ErrRefused}, 500, 0, false},
		{"NoResponse", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: workflow.ErrNoResponse}), 500, 0, false},
		{"Panic", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: &phases.PanicError{Value: "boom"}}), 500, 0, false},
		{"FiveHundredResponse", released(&workflow.TransientError{Phase: "p", RetryAfter: 3 * time.Second, Response: busy, Err: errors.New("phase responded 503")}), 503, 3 * time.Second, true},
		{"Transient", released(&workflow.TransientError{Phase: "p", RetryAfter: 1500 * time.Millisecond, Err: errors.New("provider down")}), 503, 1500 * time.Millisecond, false},
		{"TransientDatabase", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: workflow.ErrUnavailable}), 503, time.Second, false},
		{"DatabaseUnavailable", fail(fmt.Errorf("look up key: %w", workflow.ErrUnavailable)), 503, time.Second, false},
		{"KeptChanging", fail(fmt.Errorf("workflow: key kept changing: %w", workflow.ErrConflict)), 503, time.Second, false},
		{"Canceled", fail(context.Canceled), 503, time.Second, false},
		{"UnknownFlow", fail(fmt.Errorf("%w: %q", workflow.ErrUnknownFlow, "x")), 500, 0, false},
		// Bare, as the engine never returns it (it comes matching ErrNewerFormat): a
		// retry, as its class says, without the newer build's delay.
		{"UnknownRecoveryPoint", fail(workflow.ErrUnknownRecoveryPoint), 503, time.Second, false},
		{"NeedsClient", fail(fmt.Errorf("workflow: %w", workflow.ErrNeedsClient)), 500, 0, false},
		{"Misconfigured", fail(fmt.Errorf("claim: %w", workflow.ErrMisconfigured)), 500, 0, false},
		// ErrMisconfigured in a phase's transaction releases the key, but a retry
		// cannot help until the setting is fixed: 500, not 503.
		{"TransientMisconfigured", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: workflow.ErrMisconfigured}), 500, 0, false},
		{"OpenSealed", fail(fmt.Errorf("workflow: %w: the stored answer", workflow.ErrOpenSealed)), 500, 0, false},
		{"RefusedFailed", fail(workflow.ErrRefused), 500, 0, false},
		{"ControlCharacter", fail(fmt.Errorf("%w: %w at byte 2", workflow.ErrInvalidScope, workflow.ErrControlCharacter)), 401, 0, false},
		{"BodyNotJSON", fail(workflow.ErrBodyNotJSON), 400, 0, false},
		{"NotFound", fail(fmt.Errorf("%w: scope %q key %q", workflow.ErrNotFound, "a", "k")), 400, 0, false},
		{"LeaseExpired", released(&workflow.TransientError{Phase: "p", RetryAfter: 2 * time.Second, Err: workflow.ErrLeaseExpired}), 503, 2 * time.Second, false},
		{"TransientNewerFormat", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: workflow.ErrNewerFormat}), 503, workflow.NewerFormatRetryAfter, false},
		{"LastAttemptDeadLettered", &workflow.Result{Outcome: workflow.OutcomeDeadLettered, Phase: "p", RetryAfter: time.Second,
			Err: &workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: errors.New("provider down")}}, 503, time.Second, false},
		{"NewerFormat", fail(fmt.Errorf("%w: status %q", workflow.ErrNewerFormat, "paused")), 503, workflow.NewerFormatRetryAfter, false},
		{"NewerRecoveryPoint", fail(fmt.Errorf("%w (%w): no phase", workflow.ErrUnknownRecoveryPoint, workflow.ErrNewerFormat)), 503, workflow.NewerFormatRetryAfter, false},
		{"InvalidScope", fail(fmt.Errorf("%w: not UTF-8 text without NUL", workflow.ErrInvalidScope)), 401, 0, false},
		{"NotFinal", released(&workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: fmt.Errorf("status 101 is not a final response: %w", workflow.ErrNoResponse)}), 500, 0, false},
		{"Other", fail(errors.New("something internal")), 500, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := answerOf(c.out)
			require.Equal(t, c.status, a.status)
			require.Equal(t, c.retryAfter, a.retryAfter)
			require.Equal(t, c.pass, a.pass != nil)
			if !c.pass {
				require.NotEmpty(t, a.detail)
				require.NotContains(t, a.detail, c.out.Err.Error(), "the error's text is not sent")
			}
		})
	}
}

// Every error of the engine is answered in the range its class (workflow.Classify)
// gives it, whether an attempt failed with it or a phase's transient failure carried
// it: a new error is answered right once it is classed.
func TestAnswerFollowsClass(t *testing.T) {
	t.Parallel()
	inRange := func(t *testing.T, class workflow.Class, a httpAnswer) {
		t.Helper()
		switch class {
		case workflow.ClassClientFault:
			require.True(t, a.status >= 400 && a.status < 500 && a.status != 409 && a.status != 410, "client fault answered %d", a.status)
			require.Zero(t, a.retryAfter, "a client fault is not retried")
		case workflow.ClassRetry:
			require.Contains(t, []int{409, 503}, a.status)
			require.Positive(t, a.retryAfter, "a retry says when")
		case workflow.ClassDeadLettered:
			require.Equal(t, 410, a.status)
		case workflow.ClassServerFault:
			require.Equal(t, 500, a.status)
		default:
			t.Fatalf("class %v", class)
		}
	}
	for _, sentinel := range vocab.Sentinels() {
		err := fmt.Errorf("workflow: attempt: %w", sentinel)
		class := workflow.Classify(err)
		t.Run(sentinel.Error(), func(t *testing.T) {
			t.Parallel()
			inRange(t, class, answerOf(&workflow.Result{Outcome: workflow.OutcomeFailed, Err: err}))
			te := &workflow.TransientError{Phase: "p", RetryAfter: time.Second, Err: err}
			inRange(t, workflow.Classify(te), answerOf(&workflow.Result{Outcome: workflow.OutcomeReleased, Phase: "p", RetryAfter: time.Second, Err: te}))
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "1", time.Nanosecond: "1", time.Second: "1", time.Second + time.Millisecond: "2",
		29500 * time.Millisecond: "30", 30 * time.Second: "30", -time.Second: "1",
	} {
		require.Equal(t, want, retryAfter(d), "%s", d)
	}
}

func TestAnswerLogsOnlyServerFailures(t *testing.T) {
	t.Parallel()
	f := &front{log: slog.New(slog.DiscardHandler)}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	rec := httptest.NewRecorder()
	f.answer(rec, req, workflow.Request{}, &workflow.Result{Outcome: workflow.OutcomeFinished, Response: &phases.Response{Status: 0}})
	require.Equal(t, http.StatusInternalServerError, rec.Code, "a response without a status is a server failure")

	rec = httptest.NewRecorder()
	f.answer(rec, req, workflow.Request{}, &workflow.Result{Outcome: workflow.OutcomeInProgress, RetryAfter: 1100 * time.Millisecond,
		Err: &workflow.InProgressError{RetryAfter: 1100 * time.Millisecond}})
	require.Equal(t, http.StatusConflict, rec.Code)
	require.Equal(t, "2", rec.Header().Get("Retry-After"))
}

func TestCapture(t *testing.T) {
	t.Parallel()
	newCapture := func(limit int) *capture {
		return &capture{w: httptest.NewRecorder(), header: http.Header{}, limit: limit}
	}
	t.Run("FirstStatusWins", func(t *testing.T) {
		t.Parallel()
		c := newCapture(100)
		c.WriteHeader(http.StatusEarlyHints) // informational: dropped
		c.Header().Set("X-A", "1")
		c.WriteHeader(http.StatusAccepted)
		c.WriteHeader(http.StatusTeapot)
		c.Header().Set("X-B", "2")
		resp, err := c.response()
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, resp.Status)
		require.Equal(t, "1", resp.Header.Get("X-A"))
		require.Empty(t, resp.Header.Get("X-B"), "headers changed after WriteHeader are not sent")
	})
	t.Run("NoSniffWhenTypeSuppressed", func(t *testing.T) {
		t.Parallel()
		c := newCapture(100)
		c.Header()["Content-Type"] = nil
		_, err := c.WriteString("<html>")
		require.NoError(t, err)
		resp, err := c.response()
		require.NoError(t, err)
		require.Empty(t, resp.Header.Get("Content-Type"))
	})
	t.Run("NoBodyFor204", func(t *testing.T) {
		t.Parallel()
		c := newCapture(100)
		c.WriteHeader(http.StatusNoContent)
		_, err := c.Write([]byte("x"))
		require.ErrorIs(t, err, http.ErrBodyNotAllowed)
	})
	t.Run("OverTheLimit", func(t *testing.T) {
		t.Parallel()
		c := newCapture(4)
		_, err := c.Write([]byte("abcd"))
		require.NoError(t, err)
		_, err = c.Write([]byte("e"))
		require.ErrorIs(t, err, workflow.ErrResponseTooLarge)
		_, err = c.response()
		require.ErrorIs(t, err, workflow.ErrResponseTooLarge)
	})
	t.Run("InvalidStatusPanics", func(t *testing.T) {
		t.Parallel()
		require.Panics(t, func() { newCapture(1).WriteHeader(42) })
	})
	t.Run("ResponseController", func(t *testing.T) {
		t.Parallel()
		rc := http.NewResponseController(newCapture(1))
		require.NoError(t, rc.Flush())
		require.NoError(t, rc.EnableFullDuplex())
		_, _, err := rc.Hijack()
		require.ErrorIs(t, err, http.ErrNotSupported, "hijacking would escape the capture")
	})
}

// discardWriter is a ResponseWriter that keeps its header map and drops the rest.
type discardWriter struct{ h http.Header }

func (w discardWriter) Header() http.Header         { return w.h }
func (w discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w discardWriter) WriteHeader(int)             {}

// The answer to a refused attempt, rendered when the handler is made (front.refuse), is
// the one answerAny renders for the same result: status, every header, the body byte
// for byte, and the log line, whatever the configuration and log level. Writing it
// allocates one object (the header values) when the log line is not taken: it costs
// about what a bare 503 costs.
func TestRefusalPrerendered(t *testing.T) { // not parallel: testing.AllocsPerRun
	out := &workflow.Result{Outcome: workflow.OutcomeShed, RetryAfter: time.Second,
		Err: &workflow.ShedError{RetryAfter: time.Second, Err: workflow.ErrDraining}}
	req := workflow.Request{Flow: "create_charge", Method: http.MethodPost, Route: "/v1/charges", Scope: "acct", Key: "k1"}
	configs := map[string]Config{
		"defaults":            {},
		"type base":           {ProblemTypeBase: "https://api.example.com/problems/"},
		"no retention header": {Retention: -1},
		"retention of 2 days": {Retention: 48 * time.Hour},
	}
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	for name, cfg := range configs {
		for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
			newFront := func(log *strings.Builder) *front {
				f := &front{cfg: cfg.WithDefaults(), log: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: level, ReplaceAttr: noTime}))}
				f.shed = f.newRefusal()
				return f
			}
			var fastLog, anyLog strings.Builder
			fast, rendered := httptest.NewRecorder(), httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
			newFront(&fastLog).answer(fast, r, req, out)
			newFront(&anyLog).answerAny(rendered, r, req, out)
			require.Equal(t, http.StatusServiceUnavailable, fast.Code, name)
			require.Equal(t, rendered.Code, fast.Code, name)
			require.Equal(t, rendered.Header(), fast.Header(), name)
			require.Equal(t, rendered.Body.String(), fast.Body.String(), name)
			require.Equal(t, anyLog.String(), fastLog.String(), "%s at %s", name, level)
			if level == slog.LevelDebug {
				require.Contains(t, fastLog.String(), "status=503", name)
			}
		}
	}

	f := &front{cfg: (&Config{}).WithDefaults(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f.shed = f.newRefusal()
	w := discardWriter{h: http.Header{}}
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
	allocs := testing.AllocsPerRun(200, func() {
		clear(w.h)
		f.answer(w, r, req, out)
	})
	require.LessOrEqual(t, allocs, 1.0, "a refusal's answer allocates %.0f objects", allocs)
}
