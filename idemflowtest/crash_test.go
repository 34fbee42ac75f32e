package idemflowtest_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/workflow"
)

func TestBoundaries(t *testing.T) {
	t.Parallel()
	var names []string
	for _, b := range idemflowtest.Boundaries(ledgerFlow(nil, nil, flowOpts{})) {
		names = append(names, b.String())
	}
	require.Equal(t, []string{
		"debit/after-claim", "debit/before-commit", "debit/after-commit",
		"pay/before-call", "pay/after-call",
		"record/before-commit", "record/after-commit", "finished",
	}, names)
}

// TestCrashMatrix: the sound flow survives a SIGKILL at every boundary, recovered every
// way.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, ledgerSchema)
	remote := idemflowtest.NewRemote(t, nil)
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:      db,
		Flow:    ledgerFlow(db, remote, flowOpts{}),
		Request: workflow.Request{Scope: "acct", Key: "k", Body: []byte(`{}`)},
		Check:   checkLedger(remote, flowOpts{}),
	})
}

// TestInProcessMatrix: the same, abandoning each attempt in this process.
func TestInProcessMatrix(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, ledgerSchema)
	remote := idemflowtest.NewRemote(t, nil)
	r := idemflowtest.RunMatrix(t, idemflowtest.Crash{
		DB:        db,
		Flow:      ledgerFlow(db, remote, flowOpts{}),
		Request:   workflow.Request{Scope: "acct", Key: "k", Body: []byte(`{}`)},
		Check:     checkLedger(remote, flowOpts{}),
		InProcess: true,
	})
	require.Empty(t, r.Failures)
	require.Equal(t, 8*2, r.Cases)
}

// TestMatrixKeepsTheUsersHooks: the matrix adds its own hooks to the engine's without
// dropping any of the user's (an observer such as otelidemflow sets them all).
func TestMatrixKeepsTheUsersHooks(t *testing.T) {
	t.Parallel()
	db := idemflowtest.NewDB(t, ledgerSchema)
	remote := idemflowtest.NewRemote(t, nil)
	var starts, ends, origins, keys atomic.Int64
	hooks := workflow.Hooks{
		AttemptStart: func(ctx context.Context, ev workflow.AttemptEvent) context.Context { starts.Add(1); return ctx },
		AttemptEnd:   func(ctx context.Context, ev workflow.AttemptEvent) { ends.Add(1) },
		Origin:       func(ctx context.Context) string { origins.Add(1); return "" },
		Key:          func(ctx context.Context, ev workflow.KeyEvent) { keys.Add(1) },
	}
	r := idemflowtest.RunMatrix(t, idemflowtest.Crash{
		DB:        db,
		Flow:      ledgerFlow(db, remote, flowOpts{}),
		Request:   workflow.Request{Scope: "acct", Key: "k", Body: []byte(`{}`)},
		Config:    &workflow.Config{Hooks: hooks},
		Check:     checkLedger(remote, flowOpts{}),
		InProcess: true,
	})
	require.Empty(t, r.Failures)
	require.Positive(t, starts.Load(), "AttemptStart")
	require.Positive(t, ends.Load(), "AttemptEnd")
	require.Positive(t, origins.Load(), "Origin")
	require.Positive(t, keys.Load(), "Key")
}

// TestBrokenFlowsAreCaught: the matrix catches a flow that writes outside its phase's
// transaction, and one that calls the remote without the derived key, at the
// boundaries where each breaks and only there.
func TestBrokenFlowsAreCaught(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		opts      flowOpts
		inProcess bool
		// boundaries are the only ones that fail, under every recovery: where the
		// effect happened and the recovery point does not say so.
		boundaries []string
		why        string // in the failure's messages
	}{
		{"WriteOutsideTx", flowOpts{debitOnPool: true}, false, []string{"debit/before-commit"}, "ledger rows for the key"},
		{"CallWithoutDerivedKey", flowOpts{freshKey: true}, false, []string{"pay/after-call", "record/before-commit"}, "remote effects for the key"},
		{"WriteOutsideTxInProcess", flowOpts{debitOnPool: true}, true, []string{"debit/before-commit"}, "ledger rows for the key"},
		{"CallWithoutDerivedKeyInProcess", flowOpts{freshKey: true}, true, []string{"pay/after-call", "record/before-commit"}, "remote effects for the key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := idemflowtest.NewDB(t, ledgerSchema)
			remote := idemflowtest.NewRemote(t, nil)
			r := idemflowtest.RunMatrix(t, idemflowtest.Crash{
				DB:        db,
				Flow:      ledgerFlow(db, remote, tc.opts),
				Request:   workflow.Request{Scope: "acct", Key: "k", Body: []byte(`{}`)},
				Check:     checkLedger(remote, tc.opts),
				InProcess: tc.inProcess,
			})
			recs := []idemflowtest.Recovery{idemflowtest.ByRetry, idemflowtest.BySweeper, idemflowtest.BySweeperAfterCrash}
			if tc.inProcess {
				recs = recs[:2]
			}
			require.Equal(t, 8*len(recs), r.Cases)
			var failed []string
			for _, f := range r.Failures {
				failed = append(failed, f.Boundary.String()+"/"+string(f.Recovery))
				require.True(t, slices.ContainsFunc(f.Messages, func(m string) bool { return strings.Contains(m, tc.why) }),
					"%s/%s failed for another reason: %q", f.Boundary, f.Recovery, f.Messages)
			}
			var want []string
			for _, b := range tc.boundaries {
				for _, rec := range recs {
					want = append(want, b+"/"+string(rec))
				}
			}
			require.ElementsMatch(t, want, failed)
		})
	}
}
