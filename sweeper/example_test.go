package sweeper_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

// A request whose client went away after a failed call is finished by a sweeper pass,
// from its recovery point, with the request stored on the key.
func Example() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	calls := 0
	flow := phases.Flow{Name: "send_payout", Phases: []phases.Phase{
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := tx.Exec(ctx, `SELECT $1::text`, run.Key()) // the payout's own writes
			return nil, err
		}),
		phases.Call("pay", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			calls++ // a bank would get run.DerivedKey() as its idempotency key
			if calls == 1 {
				return nil, errors.New("bank timed out")
			}
			return phases.JSON(201, map[string]string{"status": "paid"})
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
	req := workflow.Request{Scope: "acct_1", Key: "payout-7", Flow: "send_payout", Method: "POST", Route: "/payouts", Body: []byte(`{"amount":100}`)}
	_, err = engine.Do(ctx, req)
	fmt.Println("first attempt:", errors.Is(err, workflow.ErrTransient))

	// The client never retries. Once the key's backoff has passed (moved here by the
	// database clock rather than waited for), a sweeper pass finishes it.
	if _, err := pool.Exec(ctx, `UPDATE idemflow_keys SET next_attempt_at = statement_timestamp()`); err != nil {
		fmt.Println(err)
		return
	}
	stats, err := engine.Sweep(ctx, &sweeper.Config{Grace: -1})
	fmt.Println("sweep:", stats.Finished, "finished", err)

	res, err := engine.Do(ctx, req)
	fmt.Println("retry:", res.Response.Status, res.Replayed, err)
	// Output:
	// first attempt: true
	// sweep: 1 finished <nil>
	// retry: 201 true <nil>
}
