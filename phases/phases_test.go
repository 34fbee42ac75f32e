package phases_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/runstate"
	"github.com/idemflow/idemflow/phases"
)

// newRun is a run as the engine makes it, and state the engine's side of it.
func newRun(info runstate.Info, data []byte) (*phases.Run, error) {
	st, err := runstate.New(info, data)
	return (*phases.Run)(st), err
}

func state(run *phases.Run) *runstate.Run { return (*runstate.Run)(run) }

func tx(name string) phases.Phase {
	return phases.Tx(name, func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil })
}

func call(name string) phases.Phase {
	return phases.Call(name, func(context.Context, *phases.Run) (*phases.Response, error) { return nil, nil })
}

func undo(context.Context, phases.DBTX, *phases.Run, string) error { return nil }

func TestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		flow phases.Flow
		want string // substring of the error; empty for valid
	}{
		{"Valid", phases.Flow{Name: "charge", Phases: []phases.Phase{tx("a"), call("b"), tx("c")}}, ""},
		{"NoPhases", phases.Flow{Name: "charge"}, "no phases"},
		{"BadFlowName", phases.Flow{Name: "Charge!", Phases: []phases.Phase{tx("a")}}, "flow name"},
		{"EmptyPhaseName", phases.Flow{Name: "f", Phases: []phases.Phase{tx("")}}, "name"},
		{"LongPhaseName", phases.Flow{Name: "f", Phases: []phases.Phase{tx(strings.Repeat("a", 65))}}, "name"},
		{"Duplicate", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a"), call("a")}}, "duplicate"},
		{"ReservedStarted", phases.Flow{Name: "f", Phases: []phases.Phase{tx(phases.Started)}}, "reserved"},
		{"ReservedFinished", phases.Flow{Name: "f", Phases: []phases.Phase{tx(phases.Finished)}}, "reserved"},
		{"NoTxPhase", phases.Flow{Name: "f", Phases: []phases.Phase{call("a")}}, "no tx phase"},
		{"NoFunction", phases.Flow{Name: "f", Phases: []phases.Phase{{Name: "a", Kind: phases.KindTx}}}, "no function"},
		{"NoKind", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a"), {Name: "b"}}}, "kind"},
		{"ClientOnly", phases.Flow{Name: "f", ClientOnly: true, Phases: []phases.Phase{phases.Call("a", nil)}}, ""},
		{"ClientOnlyTx", phases.Flow{Name: "f", ClientOnly: true, Phases: []phases.Phase{phases.Tx("a", nil), phases.Call("b", nil)}}, ""},
		{"ClientOnlyWithFunction", phases.Flow{Name: "f", ClientOnly: true, Phases: []phases.Phase{call("a")}}, "has a function"},
		{"ClientOnlyReserved", phases.Flow{Name: "f", ClientOnly: true, Phases: []phases.Phase{phases.Call(phases.Finished, nil)}}, "reserved"},
		{"Compensation", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a")}, Compensation: phases.Compensate("undo", undo)}, ""},
		{"CompensationBadName", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a")}, Compensation: phases.Compensate("Undo!", undo)}, "compensation name"},
		{"CompensationReserved", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a")}, Compensation: phases.Compensate(phases.Started, undo)}, "compensation name"},
		{"CompensationPhaseName", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a")}, Compensation: phases.Compensate("a", undo)}, "a phase's name"},
		{"CompensationNoFunction", phases.Flow{Name: "f", Phases: []phases.Phase{tx("a")}, Compensation: phases.Compensate("undo", nil)}, "no function"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.flow.Validate()
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, phases.ErrInvalidFlow)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

func TestIndex(t *testing.T) {
	t.Parallel()
	f := phases.Flow{Name: "f", Phases: []phases.Phase{tx("a"), call("b")}}
	i, err := f.Index(phases.Started)
	require.NoError(t, err)
	require.Equal(t, -1, i)
	i, err = f.Index("b")
	require.NoError(t, err)
	require.Equal(t, 1, i)
	_, err = f.Index("gone")
	require.Error(t, err)
}

func TestSlotsAndRevert(t *testing.T) {
	t.Parallel()
	type pair struct{ A, B int }
	id := phases.NewSlot[int64]("id")
	p := phases.NewSlot[pair]("pair")
	run, err := newRun(runstate.Info{ID: "row-1"}, []byte(`{"id":7}`))
	require.NoError(t, err)

	got, err := id.Get(run)
	require.NoError(t, err)
	require.EqualValues(t, 7, got)
	_, err = p.Get(run)
	require.ErrorIs(t, err, phases.ErrNoValue)

	state(run).Enter("two")
	require.NoError(t, p.Set(run, pair{1, 2}))
	require.NoError(t, id.Set(run, 8))
	state(run).Revert()
	_, ok, err := p.Lookup(run)
	require.NoError(t, err)
	require.False(t, ok, "a failed phase's data changes are undone")
	got, _ = id.Get(run)
	require.EqualValues(t, 7, got)

	require.NoError(t, p.Set(run, pair{3, 4}))
	data, err := state(run).Data()
	require.NoError(t, err)
	again, err := newRun(runstate.Info{}, data)
	require.NoError(t, err)
	pv, err := p.Get(again)
	require.NoError(t, err)
	require.Equal(t, pair{3, 4}, pv)

	_, err = newRun(runstate.Info{}, []byte(`not json`))
	require.Error(t, err)
}

func TestDerivedKey(t *testing.T) {
	t.Parallel()
	run, err := newRun(runstate.Info{ID: "0b0e7c4e-1111-4222-8333-944445555666"}, nil)
	require.NoError(t, err)
	state(run).Enter("provider_charge")
	require.Equal(t, "0b0e7c4e-1111-4222-8333-944445555666:provider_charge", run.DerivedKey())
	require.Equal(t, run.DerivedKey(), run.DerivedKey(), "deterministic")
	require.Equal(t, run.DerivedKey()+":refund", run.DerivedKeyFor("refund"))
	state(run).Enter("other")
	require.NotEqual(t, "0b0e7c4e-1111-4222-8333-944445555666:provider_charge", run.DerivedKey())
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	resp, err := phases.JSON(201, map[string]int{"a": 1})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.JSONEq(t, `{"a":1}`, string(resp.Body))
	_, err = phases.JSON(200, make(chan int))
	require.Error(t, err)

	var term *phases.TerminalError
	require.ErrorAs(t, phases.Fail(&phases.Response{Status: 402}), &term)
	require.Equal(t, 402, term.Response.Status)

	cause := context.DeadlineExceeded
	var te *phases.RetryError
	require.ErrorAs(t, phases.RetryLater(cause, 5), &te)
	require.ErrorIs(t, phases.RetryLater(cause, 5), cause)
}

func TestRunPhaseFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run, err := newRun(runstate.Info{ID: "row-1", Attempt: 2}, nil)
	require.NoError(t, err)
	var tx phases.DBTX // a phase that does not touch its transaction
	var saw []string
	first := phases.Tx("first", func(_ context.Context, got phases.DBTX, r *phases.Run) (*phases.Response, error) {
		require.Nil(t, got)
		saw = append(saw, r.DerivedKey())
		return nil, nil
	})
	last := phases.Call("last", func(_ context.Context, r *phases.Run) (*phases.Response, error) {
		saw = append(saw, r.DerivedKey())
		return phases.JSON(201, r.Attempt())
	})

	state(run).Enter(first.Name)
	resp, err := first.TxFunc(ctx, tx, run)
	require.NoError(t, err)
	require.Nil(t, resp)
	state(run).Enter(last.Name)
	resp, err = last.CallFunc(ctx, run)
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, "2", string(resp.Body))
	require.Equal(t, []string{"row-1:first", "row-1:last"}, saw)
}
