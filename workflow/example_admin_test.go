package workflow_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The admin API: a key whose call failed is listed, inspected with its history (the
// failed phase named), and released, which makes it due at once (stuck) instead of
// after its backoff; a finished key is purged, after which its key starts a new
// operation.
func ExampleEngine_ListKeys() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	fail := true
	engine, err := notifyEngine(pool, &fail)
	if err != nil {
		fmt.Println(err)
		return
	}
	req := workflow.Request{Scope: "acct_1", Key: "mail-42", Flow: "notify", Method: "POST", Route: "/notify", Body: []byte(`{}`)}
	_, err = engine.Do(ctx, req)
	fmt.Println("first attempt:", errors.Is(err, workflow.ErrTransient))

	page, err := engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysInProgress, Flow: "notify"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, k := range page.Keys {
		fmt.Println("listed:", k.Scope, k.Key, k.Status, k.RecoveryPoint, k.Attempts)
	}
	info, err := engine.InspectKey(ctx, "acct_1", "mail-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("failed in:", info.FailedPhase, "-", info.LastError)
	for _, a := range info.History {
		fmt.Println("history:", a.Attempt, a.By, a.Outcome, a.Phase)
	}
	fmt.Println("release:", engine.ReleaseKey(ctx, "acct_1", "mail-42"))
	page, err = engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysStuck})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("stuck:", len(page.Keys), page.Keys[0].Status)

	fail = false
	res, err := engine.Do(ctx, req) // the client's retry takes the released key over
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("retry:", res.Response.Status)
	fmt.Println("purge:", engine.PurgeKey(ctx, "acct_1", "mail-42"))
	res, err = engine.Do(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after purge, replayed:", res.Replayed)
	// Output:
	// first attempt: true
	// listed: acct_1 mail-42 in_progress started 1
	// failed in: send - mail server down
	// history: 1 client released send
	// release: <nil>
	// stuck: 1 stuck
	// retry: 202
	// purge: <nil>
	// after purge, replayed: false
}

// notifyEngine is an engine with the flow "notify": a call that fails while *fail is
// true, then a tx phase that answers 202.
func notifyEngine(pool *pgxpool.Pool, fail *bool) (*workflow.Engine, error) {
	flow := phases.Flow{Name: "notify", Phases: []phases.Phase{
		phases.Call("send", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if *fail {
				return nil, errors.New("mail server down")
			}
			return nil, nil
		}),
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: 202, Body: []byte("sent")}, nil
		}),
	}}
	engine, err := workflow.New(pool, nil)
	if err != nil {
		return nil, err
	}
	return engine, engine.Register(flow)
}
