package workflow_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// pipelinedOrders is a flow of two pipelined tx phases around a call: place sends its
// insert with the engine's claim and commit in one round trip (its phase data is known
// up front); confirm reads what its update returns, in a callback, and decides its
// answer from it with Then: two round trips, with the transaction open in between.
func pipelinedOrders(reserve func(derivedKey string) error) phases.Flow {
	orderID := phases.NewSlot[string]("order_id")
	return phases.Flow{Name: "place_order", Phases: []phases.Phase{
		phases.Pipelined("place", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			id := "ord_" + run.ID() // the key row's id: the same on every retry
			p.Queue(`INSERT INTO orders (id, status) VALUES ($1, 'pending')`, id)
			return nil, orderID.Set(run, id)
		}),
		phases.Call("reserve_stock", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			return nil, reserve(run.DerivedKey())
		}),
		phases.Pipelined("confirm", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			id, err := orderID.Get(run)
			if err != nil {
				return nil, err
			}
			var status string
			p.Queue(`UPDATE orders SET status = 'confirmed' WHERE id = $1 RETURNING status`, id).
				QueryRow(func(row pgx.Row) error { return row.Scan(&status) })
			p.Then(func(run *phases.Run) (*phases.Response, error) {
				return phases.JSON(201, map[string]string{"status": status})
			})
			return nil, nil
		}),
	}}
}

// Pipelined tx phases declare their statements up front; the engine sends them with
// its own (BEGIN, the claim or the fence, the key row's write, COMMIT), so a phase
// costs one round trip, or two when it reads its statements' results.
func Example_pipelined() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	engine, err := workflow.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := engine.Register(pipelinedOrders(func(string) error { return nil })); err != nil {
		fmt.Println(err)
		return
	}
	req := workflow.Request{Scope: "acct_1", Key: "order-1", Flow: "place_order", Method: "POST", Route: "/orders", Body: []byte(`{}`)}
	for range 2 {
		res, err := engine.Do(ctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed)
	}
	// Output:
	// 201 {"status":"confirmed"} replayed: false
	// 201 {"status":"confirmed"} replayed: true
}
