package workflow_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// A flow of ordered phases run under an idempotency key: a tx phase, a call phase that
// fails once and is resumed from the recovery point with the same derived key, and a
// tx phase that responds.
func Example() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id serial PRIMARY KEY, status text NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	orderID := phases.NewSlot[int]("order_id")
	calls := 0
	flow := phases.Flow{Name: "place_order", Phases: []phases.Phase{
		phases.Tx("create_order", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			var id int
			if err := tx.QueryRow(ctx, `INSERT INTO orders (status) VALUES ($1) RETURNING id`, "pending").Scan(&id); err != nil {
				return nil, err
			}
			return nil, orderID.Set(run, id)
		}),
		phases.Call("reserve_stock", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			calls++ // a remote call would send run.DerivedKey() as its idempotency key
			if calls == 1 {
				return nil, errors.New("warehouse timed out")
			}
			return nil, nil
		}),
		phases.Tx("confirm", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := orderID.Get(run)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'confirmed' WHERE id = $1`, id); err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]any{"order": id, "status": "confirmed"})
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
	req := workflow.Request{Scope: "acct_1", Key: "order-42", Flow: "place_order",
		Method: "POST", Route: "/orders", Body: []byte(`{"sku":"tea"}`)}
	show := func(res *workflow.Result, err error) {
		switch {
		case errors.Is(err, workflow.ErrTransient):
			fmt.Println("transient failure; nothing stored, retry later")
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Printf("%d replayed=%t %s\n", res.Response.Status, res.Replayed, res.Response.Body)
		}
	}

	show(engine.Do(ctx, req)) // the warehouse times out
	show(engine.Do(ctx, req)) // resumes at reserve_stock, not create_order
	show(engine.Do(ctx, req)) // replays the stored answer
	req.Body = []byte(`{"sku":"coffee"}`)
	show(engine.Do(ctx, req)) // the same key for another request

	var orders int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// transient failure; nothing stored, retry later
	// 201 replayed=false {"order":1,"status":"confirmed"}
	// 201 replayed=true {"order":1,"status":"confirmed"}
	// error: idempotency key reused for a different request
	// orders: 1
}
