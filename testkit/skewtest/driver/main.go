// Command driver is the skew test's program: one small flow run by one build of
// idemflow. The skew test (testkit/skewtest) builds it twice, from this tree and from
// the previous release's (the file is copied into that tree), and runs both against
// one schema. It uses only API that both releases have: workflow.New, Register, Do,
// Resume, Hooks.PhaseEnd; keep it that way. A sweeper pass is the one call whose API
// changed: sweep.go holds this tree's, and the skew test writes the previous
// release's in its place (skew_test.go, previousSweep). Settings only this tree has
// are set in options.go, which the skew test replaces the same way (previousOptions).
//
//	driver do KEY BODY    one attempt; prints its answer as a JSON line
//	driver resume KEY     Engine.Resume; prints its answer
//	driver sweep          one sweeper pass (no grace, one attempt); prints its stats
//	driver redrive KEY    Engine.Redrive; prints {} or the error's class
//
// DATABASE_URL names the schema (by search_path). SKEW_CRASH_AFTER=phase makes the
// process exit with status 3 right after that phase ends, with no cleanup: a crash at
// that boundary. SKEW_FAIL_REMOTE=1 makes the remote call fail (a transient failure).
// SKEW_HISTORY_OMIT=1 (this tree only) turns on workflow.Config.HistoryOmitCleanFinish.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// answer is what the driver prints for do and resume.
type answer struct {
	Status   int    `json:"status,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	Body     string `json:"body,omitempty"`
	// Err is the class of the error: in_progress, mismatch, newer_format, transient,
	// dead, other.
	Err    string `json:"err,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "driver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: driver do KEY BODY | resume KEY | sweep")
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := &workflow.Config{Lease: 5 * time.Second, Hooks: crash(os.Getenv("SKEW_CRASH_AFTER"))}
	options(cfg)
	e, err := workflow.New(pool, cfg)
	if err != nil {
		return err
	}
	if err := e.Register(flow(pool)); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	switch {
	case args[0] == "do" && len(args) == 3:
		res, err := e.Do(ctx, workflow.Request{Scope: "acct", Key: args[1], Flow: "skew",
			Method: "POST", Route: "/skew", Body: []byte(args[2])})
		return out.Encode(answerOf(res, err))
	case args[0] == "resume" && len(args) == 2:
		res, err := e.Resume(ctx, "acct", args[1])
		return out.Encode(answerOf(res, err))
	case args[0] == "redrive" && len(args) == 2:
		a := answer{}
		if err := e.Redrive(ctx, "acct", args[1]); err != nil {
			a = answerOf(nil, err)
		}
		return out.Encode(a)
	case args[0] == "sweep" && len(args) == 1:
		st, err := sweep(ctx, e)
		if err != nil {
			return err
		}
		return out.Encode(st)
	}
	return fmt.Errorf("unknown command %q", args)
}

// crash is the SKEW_CRASH_AFTER hook.
func crash(after string) workflow.Hooks {
	if after == "" {
		return workflow.Hooks{}
	}
	return workflow.Hooks{PhaseEnd: func(_ context.Context, ev workflow.PhaseEvent, err error) {
		if err == nil && ev.Phase == after {
			os.Exit(3)
		}
	}}
}

func answerOf(res *workflow.Result, err error) answer {
	if err == nil {
		return answer{Status: res.Response.Status, Replayed: res.Replayed, Body: string(res.Response.Body)}
	}
	a := answer{Err: "other", Detail: err.Error()}
	var ip *workflow.InProgressError
	var te *workflow.TransientError
	switch {
	case errors.As(err, &ip):
		a.Err = "in_progress"
	case errors.Is(err, workflow.ErrMismatch):
		a.Err = "mismatch"
	case errors.Is(err, workflow.ErrDeadLettered):
		a.Err = "dead"
	case errors.As(err, &te):
		a.Err = "transient"
	case isNewer(err):
		a.Err = "newer_format"
	}
	return a
}

// flow debits, calls a remote that dedupes on the derived key, and credits, answering
// with what it recorded: every effect is one row in the test's tables (skew_effects,
// skew_remote, skew_remote_calls), so the test counts them.
func flow(pool *pgxpool.Pool) phases.Flow {
	effect := func(name string) phases.TxFunc {
		return func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := tx.Exec(ctx, `INSERT INTO skew_effects (scope, key, phase) VALUES ($1, $2, $3)`, run.Scope(), run.Key(), name)
			return nil, err
		}
	}
	remote := phases.NewSlot[string]("remote")
	return phases.Flow{Name: "skew", Phases: []phases.Phase{
		phases.Tx("debit", effect("debit")),
		phases.Call("remote", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if os.Getenv("SKEW_FAIL_REMOTE") == "1" {
				return nil, errors.New("remote unavailable")
			}
			dk := run.DerivedKey()
			if _, err := pool.Exec(ctx, `INSERT INTO skew_remote_calls (derived_key) VALUES ($1)`, dk); err != nil {
				return nil, err
			}
			_, err := pool.Exec(ctx, `INSERT INTO skew_remote (derived_key, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`, dk, run.Key())
			if err != nil {
				return nil, err
			}
			return nil, remote.Set(run, dk)
		}),
		phases.Tx("credit", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := effect("credit")(ctx, tx, run); err != nil {
				return nil, err
			}
			dk, err := remote.Get(run)
			if err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]any{"key": run.Key(), "remote": dk, "body": json.RawMessage(run.Body())})
		}),
	}}
}

// isNewer reports whether err is workflow.ErrNewerFormat, by its text: the previous
// release may not have the name, and this file builds against it too.
func isNewer(err error) bool {
	return strings.Contains(err.Error(), "format this build does not read")
}
