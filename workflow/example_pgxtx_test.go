package workflow_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// recordAudit is code written for a pgx.Tx, as a library's "...Tx" function is (River's
// InsertTx, say): it may open a savepoint, and it never commits the caller's
// transaction.
func recordAudit(ctx context.Context, tx pgx.Tx, what string) error {
	return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		_, err := sp.Exec(ctx, `INSERT INTO audit (what) VALUES ($1)`, what)
		return err
	})
}

// A tx phase hands its transaction to code that takes a pgx.Tx: what that code writes
// commits with the phase, and a savepoint it rolls back undoes only its own work.
// Committing or rolling back the phase's own transaction is refused, and fails the
// phase.
func Example_pgxTx() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE audit (what text PRIMARY KEY)`); err != nil {
		fmt.Println(err)
		return
	}
	tryCommit := true
	flow := phases.Flow{Name: "audited", Phases: []phases.Phase{
		phases.Tx("write", func(ctx context.Context, db phases.DBTX, run *phases.Run) (*phases.Response, error) {
			tx := db.(pgx.Tx) // the engine's DBTX is also a pgx.Tx
			if err := recordAudit(ctx, tx, "opened"); err != nil {
				return nil, err
			}
			// A duplicate fails inside its savepoint; the phase's transaction goes on.
			fmt.Println("duplicate refused:", recordAudit(ctx, tx, "opened") != nil)
			if err := recordAudit(ctx, tx, "checked"); err != nil {
				return nil, err
			}
			if tryCommit {
				fmt.Println("commit refused:", errors.Is(tx.Commit(ctx), phases.ErrTxManaged))
			}
			return &phases.Response{Status: 200}, nil
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
	req := workflow.Request{Scope: "s", Key: "k", Flow: "audited", Method: "POST", Route: "/audit", Body: []byte(`{}`)}
	_, err = engine.Do(ctx, req)
	fmt.Println("phase failed after the refused commit:", errors.Is(err, phases.ErrTxManaged))
	tryCommit = false
	res, err := engine.Do(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("retry answered", res.Response.Status)

	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM audit`).Scan(&n)
	fmt.Println("audit rows:", n)
	// Output:
	// duplicate refused: true
	// commit refused: true
	// phase failed after the refused commit: true
	// duplicate refused: true
	// retry answered 200
	// audit rows: 2
}
