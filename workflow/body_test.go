package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// bodyProbe is a flow whose three phases (pipelined, call, Go-code) each read the
// request through one phases.Body, recording what each got; its call phase fails
// transiently once for keys named "resume".
type bodyProbe struct {
	mu      sync.Mutex
	decodes map[string]int      // the counting Body's decode calls, by body
	got     map[string][]string // each phase's reading, by key: the amount or the error
	failed  map[string]bool
	stray   error // what a Body not made by NewBody answered
}

type bodyAmount struct {
	Amount int `json:"amount"`
}

func (p *bodyProbe) flow() phases.Flow {
	body := phases.NewBody(func(b []byte) (bodyAmount, error) {
		var a bodyAmount
		err := json.Unmarshal(b, &a)
		return a, err
	})
	read := func(run *phases.Run) {
		a, err := body.Get(run)
		p.mu.Lock()
		defer p.mu.Unlock()
		got := "amount " + strconv.Itoa(a.Amount)
		if err != nil {
			got = "error " + err.Error()
		}
		p.got[run.Key()] = append(p.got[run.Key()], got)
	}
	counting := phases.NewBody(func(b []byte) (bodyAmount, error) {
		p.mu.Lock()
		p.decodes[string(b)]++
		p.mu.Unlock()
		return bodyAmount{}, nil
	})
	return phases.Flow{Name: "body_probe", Phases: []phases.Phase{
		phases.Pipelined("one", func(run *phases.Run, _ *phases.Pipeline) (*phases.Response, error) {
			read(run)
			_, _ = counting.Get(run)
			_, err := (&phases.Body[int]{}).Get(run)
			p.mu.Lock()
			p.stray = err
			p.mu.Unlock()
			return nil, nil
		}),
		phases.Call("two", func(_ context.Context, run *phases.Run) (*phases.Response, error) {
			read(run)
			_, _ = counting.Get(run)
			p.mu.Lock()
			defer p.mu.Unlock()
			if run.Key() == "resume" && !p.failed[run.Key()] {
				p.failed[run.Key()] = true
				return nil, phases.RetryLater(errors.New("provider unavailable"), time.Millisecond)
			}
			return nil, nil
		}),
		phases.Tx("three", func(_ context.Context, _ phases.DBTX, run *phases.Run) (*phases.Response, error) {
			read(run)
			_, _ = counting.Get(run)
			return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
		}),
	}}
}

func TestBodyDecodedOncePerAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testflow.Start(t)
	e, err := workflow.New(db.Pool, nil)
	require.NoError(t, err)
	p := &bodyProbe{decodes: map[string]int{}, got: map[string][]string{}, failed: map[string]bool{}}
	require.NoError(t, e.Register(p.flow()))
	do := func(key, body string) (*workflow.Result, error) {
		return e.Do(ctx, workflow.Request{Scope: "acct", Key: key, Flow: "body_probe", Method: "POST", Route: "/probe", Body: []byte(body)})
	}

	t.Run("EveryPhaseOfAnAttemptGetsTheFirstDecoding", func(t *testing.T) {
		res, err := do("fresh", `{"amount":7}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.Equal(t, 1, p.decodes[`{"amount":7}`], "three phases of one attempt, one decoding")
		require.Equal(t, []string{"amount 7", "amount 7", "amount 7"}, p.got["fresh"])
		require.EqualError(t, p.stray, "phases: a Body not made by NewBody")

		res, err = do("fresh", `{"amount":7}`)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 1, p.decodes[`{"amount":7}`], "a replay runs no phase")
	})

	t.Run("AResumedAttemptDecodesAgain", func(t *testing.T) {
		_, err := do("resume", `{"amount":3}`)
		require.Error(t, err, "the call phase failed transiently")
		require.Equal(t, 1, p.decodes[`{"amount":3}`])
		res, err := do("resume", `{"amount":3}`)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.Equal(t, 2, p.decodes[`{"amount":3}`], "the second attempt, resumed at one, decodes once for two and three")
		require.Equal(t, []string{"amount 3", "amount 3", "amount 3", "amount 3"}, p.got["resume"])
	})

	t.Run("AnErrorIsKeptLikeAValue", func(t *testing.T) {
		res, err := do("bad", `{"amount":"seven"}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
		require.Equal(t, 1, p.decodes[`{"amount":"seven"}`])
		got := p.got["bad"]
		require.Len(t, got, 3)
		require.Contains(t, got[0], "error json: cannot unmarshal string")
		require.Equal(t, []string{got[0], got[0], got[0]}, got, "every phase gets the first decoding's error")
	})
}
