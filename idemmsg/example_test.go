package idemmsg_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// A consumer hands each delivery to Handle: the first runs the flow, a redelivery of
// the same message replays its answer (both are acked), and a message that reuses the
// key with another payload is terminated.
func Example() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE payouts (msg_id text NOT NULL, body jsonb NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	engine, err := workflow.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = engine.Register(phases.Flow{Name: "payout", Phases: []phases.Phase{
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO payouts (msg_id, body) VALUES ($1, $2)`, run.Key(), run.Body()); err != nil {
				return nil, err
			}
			return &phases.Response{Status: 200, Body: []byte("paid")}, nil
		}),
	}})
	if err != nil {
		fmt.Println(err)
		return
	}

	deliver := func(id, payload string) {
		d := idemmsg.Handle(ctx, engine, idemmsg.Message{Scope: "payouts-consumer", Key: id, Flow: "payout", Payload: []byte(payload)})
		switch d.Action {
		case idemmsg.Ack:
			fmt.Printf("%s: ack %s (replayed: %v)\n", id, d.Result.Response.Body, d.Result.Replayed)
		case idemmsg.Retry:
			fmt.Printf("%s: retry in %v\n", id, d.Delay)
		case idemmsg.Terminate:
			fmt.Printf("%s: terminate: %v\n", id, d.Err)
		}
	}
	deliver("msg-1", `{"amount": 100}`)
	deliver("msg-1", `{"amount": 100}`) // redelivered
	deliver("msg-1", `{"amount": 999}`) // same id, another payload

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payouts`).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("payouts recorded:", n)
	// Output:
	// msg-1: ack paid (replayed: false)
	// msg-1: ack paid (replayed: true)
	// msg-1: terminate: idempotency key reused for a different request
	// payouts recorded: 1
}

// Decide maps the result of each attempt to what a consumer does with the delivery.
func ExampleDecide() {
	results := []struct {
		name string
		out  workflow.Result
	}{
		{"finished or replayed", workflow.Result{Outcome: workflow.OutcomeFinished, Response: &phases.Response{Status: 200}}},
		{"in progress", workflow.Result{Outcome: workflow.OutcomeInProgress, RetryAfter: 3 * time.Second,
			Err: &workflow.InProgressError{RetryAfter: 3 * time.Second}}},
		{"transient", workflow.Result{Outcome: workflow.OutcomeReleased, RetryAfter: 2 * time.Second,
			Err: &workflow.TransientError{Phase: "bank_payout", RetryAfter: 2 * time.Second}}},
		{"database unavailable", workflow.Result{Outcome: workflow.OutcomeFailed, Err: workflow.ErrUnavailable}},
		{"mismatch", workflow.Result{Outcome: workflow.OutcomeMismatch, Err: workflow.ErrMismatch}},
		{"invalid key", workflow.Result{Outcome: workflow.OutcomeFailed, Err: workflow.ErrInvalidKey}},
		{"dead-lettered", workflow.Result{Outcome: workflow.OutcomeFailed, Err: workflow.ErrDeadLettered}},
	}
	for _, r := range results {
		d := idemmsg.Decide(&r.out)
		fmt.Printf("%-21s %-9v %v\n", r.name, d.Action, d.Delay)
	}
	// Output:
	// finished or replayed  ack       0s
	// in progress           retry     3s
	// transient             retry     2s
	// database unavailable  retry     1s
	// mismatch              terminate 0s
	// invalid key           terminate 0s
	// dead-lettered         terminate 0s
}
