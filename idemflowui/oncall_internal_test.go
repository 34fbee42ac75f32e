package idemflowui

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// Every status the pages explain links a section that docs/OPERATIONS.md has (by
// GitHub's anchors: lower case, spaces to hyphens, other punctuation dropped), and the
// three on-call statuses link runbook sections.
func TestRunbookAnchors(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/OPERATIONS.md")
	require.NoError(t, err)
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	anchors := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, "#") {
			title := strings.TrimSpace(strings.TrimLeft(line, "#"))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(title), ""), " ", "-")] = true
		}
	}
	for _, status := range statuses {
		text, link := explain(RunbookURLDefault, status)
		require.NotEmpty(t, text, "%s is explained", status)
		anchor, ok := strings.CutPrefix(link, RunbookURLDefault+"#")
		require.True(t, ok, "%s: %s", status, link)
		require.True(t, anchors[anchor], "%s: docs/OPERATIONS.md has no section #%s", status, anchor)
		if status != workflow.KeysFinished {
			require.True(t, strings.HasPrefix(anchor, "runbook-"), "%s links a runbook, not #%s", status, anchor)
		}
	}
}

// A last error is classed by the engine's own error it names, the innermost first;
// any other is the phase's own when the phase is known.
func TestClassify(t *testing.T) {
	t.Parallel()
	transient := func(err error) string { return (&workflow.TransientError{Phase: "pay", Err: err}).Error() }
	for _, c := range []struct {
		last, phase, class string
	}{
		{transient(&phases.PanicError{Value: "boom"}), "pay", "panic"},
		{transient(workflow.ErrResponseTooLarge), "answer", "response too large"},
		{"handler ran but its answer cannot be stored: " + workflow.ErrResponseTooLarge.Error(), "", "response too large"},
		{transient(workflow.ErrLeaseExpired), "reserve", "lease expired"},
		{workflow.ErrUnknownRecoveryPoint.Error() + ": \"gone\"", "", "unknown recovery point"},
		{"provider answered 503", "pay", "phase error"},
		{transient(os.ErrDeadlineExceeded), "pay", "phase error"},
		{"something else", "", "other"},
		{"", "", ""},
	} {
		class, hint := classify(c.last, c.phase)
		require.Equal(t, c.class, class, "%q in %q", c.last, c.phase)
		require.Equal(t, c.class == "", hint == "", "%q: a class has a hint", c.last)
	}
}

// A finished key's call phases are "sent" when its history says the finishing
// attempt ran them, and "sent, unless the flow answered before it" when that
// attempt's entry was derived from the row (Config.HistoryOmitCleanFinish) or the
// key has no history.
func TestDerivedKeysOfAFinishedKey(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/unused") // never connects
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := workflow.New(pool, nil)
	require.NoError(t, err)
	noop := func(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) { return nil, nil }
	require.NoError(t, e.Register(phases.Flow{Name: "f", Phases: []phases.Phase{
		phases.Tx("reserve", noop),
		phases.Call("pay", func(context.Context, *phases.Run) (*phases.Response, error) { return nil, nil }),
		phases.Tx("settle", noop),
	}}))
	at := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	state := func(history ...workflow.Attempt) string {
		info := &workflow.KeyInfo{KeySummary: workflow.KeySummary{Flow: "f", Status: workflow.KeysFinished,
			RecoveryPoint: phases.Finished, FinishedAt: &at}, History: history}
		keys, known := derivedKeys(e, info)
		require.True(t, known)
		require.Len(t, keys, 1)
		require.Equal(t, "pay", keys[0].Phase)
		return keys[0].State
	}
	full := workflow.Attempt{Attempt: 1, Phases: []string{"reserve", "pay", "settle"}, Outcome: workflow.OutcomeFinished}
	derived := workflow.Attempt{Attempt: 1, Outcome: workflow.OutcomeFinished, At: at, Derived: true}
	dead := workflow.Attempt{Attempt: 1, Phases: []string{"reserve"}, Outcome: workflow.OutcomeDeadLettered, Phase: "pay"}
	require.Equal(t, "sent", state(full))
	require.Equal(t, "sent, unless the flow answered before it (no history kept)", state())
	require.Equal(t, "sent, unless the flow answered before it (the finishing attempt stored no entry)", state(derived))
	require.Equal(t, "sent, unless the flow answered before it (the finishing attempt stored no entry)", state(dead, derived))
}
