package idemflowui

import (
	"os"
	"regexp"
	"strings"
	"testing"

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
