package idemhttp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// TestShedHold: with Config.ShedHold set, the answer to an attempt turned away because
// the engine is overloaded is written only once the hold is over (the hold runs with
// the request's context and ShedHold), and is then the usual refusal; a draining
// engine's refusal and every refusal without ShedHold go at once, and so does one
// beyond ShedHeldMax held at once. The count of held refusals comes back down.
func TestShedHold(t *testing.T) {
	t.Parallel()
	overloaded := &workflow.Result{Outcome: workflow.OutcomeShed, RetryAfter: time.Second,
		Err: &workflow.ShedError{RetryAfter: time.Second, Err: workflow.ErrOverloaded}}
	draining := &workflow.Result{Outcome: workflow.OutcomeShed, RetryAfter: time.Second,
		Err: &workflow.ShedError{RetryAfter: time.Second, Err: workflow.ErrDraining}}
	req := workflow.Request{Flow: "create_charge", Method: http.MethodPost, Route: "/v1/charges", Scope: "acct", Key: "k1"}
	type holdCall struct {
		ctx     context.Context
		d       time.Duration
		written bool // something was written before the hold ended
	}
	answer := func(hold time.Duration, out *workflow.Result, preHeld int64) (*httptest.ResponseRecorder, []holdCall, *front) {
		f := &front{cfg: (&Config{ShedHold: hold}).WithDefaults(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		f.shed = f.newRefusal()
		f.held.Store(preHeld)
		w := httptest.NewRecorder()
		var calls []holdCall
		f.hold = func(ctx context.Context, d time.Duration) {
			require.Equal(t, preHeld+1, f.held.Load(), "counted while held")
			calls = append(calls, holdCall{ctx: ctx, d: d, written: w.Flushed || w.Body.Len() > 0 || len(w.Header()) > 0})
		}
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
		f.answer(w, r, req, out)
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.Equal(t, "1", w.Header().Get("Retry-After"))
		require.Equal(t, preHeld, f.held.Load(), "the count comes back down")
		return w, calls, f
	}

	_, calls, _ := answer(300*time.Millisecond, overloaded, 0)
	require.Len(t, calls, 1, "held")
	require.Equal(t, 300*time.Millisecond, calls[0].d)
	require.False(t, calls[0].written, "nothing written before the hold ended")
	require.NotNil(t, calls[0].ctx, "the request's context, which ends when its client goes away")

	_, calls, _ = answer(300*time.Millisecond, draining, 0)
	require.Empty(t, calls, "a draining engine's refusal is answered at once")
	_, calls, _ = answer(0, overloaded, 0)
	require.Empty(t, calls, "no hold without ShedHold")
	_, calls, _ = answer(300*time.Millisecond, overloaded, ShedHeldMax)
	require.Empty(t, calls, "beyond ShedHeldMax held at once, answered at once")
	_, calls, _ = answer(300*time.Millisecond, overloaded, ShedHeldMax-1)
	require.Len(t, calls, 1, "the last place")
}

// TestShedHoldFor: the hold ends when the request's context does (its client went
// away), however long it was to be; and it ends when its time is up.
func TestShedHoldFor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	holdFor(ctx, time.Hour) // a hold that ignored its context would hang the test
	holdFor(context.Background(), time.Nanosecond)
}

// TestShedHoldValidated: ShedHold outside 0..ShedHoldMax is refused when the handler
// is made.
func TestShedHoldValidated(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Millisecond, ShedHoldMax + time.Millisecond} {
		c := (&Config{Scope: func(*http.Request) (string, error) { return "a", nil }, ShedHold: d}).WithDefaults()
		require.ErrorContains(t, c.validate(), "Config.ShedHold", d.String())
	}
	c := (&Config{Scope: func(*http.Request) (string, error) { return "a", nil }, ShedHold: ShedHoldMax}).WithDefaults()
	require.NoError(t, c.validate())
}
