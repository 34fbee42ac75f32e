package workflow_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// Bulk actions and the cancel of a key: three keys fail in their call phase; a dry
// run counts those whose error names the mail server, a release acts on exactly those;
// one key is then cancelled with a final answer, refused first because its call phase
// may have reached the mail server, and forced once that was checked.
func ExampleEngine_BulkKeys() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	flow := phases.Flow{Name: "notify", Phases: []phases.Phase{
		phases.Call("send", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			return nil, errors.New("mail server down")
		}),
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return &phases.Response{Status: 202, Body: []byte("sent")}, nil
		}),
	}}
	engine, err := workflow.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := engine.Register(flow); err != nil {
		fmt.Println(err)
		return
	}
	for _, key := range []string{"mail-1", "mail-2", "mail-3"} {
		req := workflow.Request{Scope: "acct_1", Key: key, Flow: "notify", Method: "POST", Route: "/notify", Body: []byte(`{}`)}
		if _, err := engine.Do(ctx, req); !errors.Is(err, workflow.ErrTransient) {
			fmt.Println("want a transient failure, got", err)
			return
		}
	}
	opts := workflow.BulkOptions{Action: workflow.BulkRelease, Flow: "notify", ErrorContains: "mail server", DryRun: true}
	res, err := engine.BulkKeys(ctx, opts)
	fmt.Println("dry run:", res.Matched, err)
	opts.DryRun = false
	res, err = engine.BulkKeys(ctx, opts)
	fmt.Println("released:", res.Acted, err)
	_, err = engine.BulkKeys(ctx, workflow.BulkOptions{Action: workflow.BulkRelease})
	fmt.Println("no filter:", errors.Is(err, workflow.ErrEmptyFilter))

	answer := workflow.CancelOptions{Status: 422, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("cancelled")}
	err = engine.CancelKey(ctx, "acct_1", "mail-1", answer)
	var refused *workflow.CallMayHaveRunError
	if errors.As(err, &refused) {
		fmt.Println("refused: call phases", refused.Phases, "may have run")
	}
	answer.Force = true // the mail server was checked: nothing was sent under the derived key
	fmt.Println("forced:", engine.CancelKey(ctx, "acct_1", "mail-1", answer))
	retry, err := engine.Do(ctx, workflow.Request{Scope: "acct_1", Key: "mail-1", Flow: "notify", Method: "POST", Route: "/notify", Body: []byte(`{}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("retry:", retry.Replayed, retry.Response.Status, string(retry.Response.Body))
	// Output:
	// dry run: 3 <nil>
	// released: 3 <nil>
	// no filter: true
	// refused: call phases [send] may have run
	// forced: <nil>
	// retry: true 422 cancelled
}
