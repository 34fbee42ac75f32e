package phases_test

import (
	"context"
	"fmt"

	"github.com/idemflow/idemflow/phases"
)

// paymentProvider stands for a remote API that takes an idempotency key.
type paymentProvider struct{}

func (paymentProvider) Charge(ctx context.Context, idempotencyKey string, amount int64) error {
	return nil
}

var provider paymentProvider

// The flow of the package documentation, as written there: a tx phase that inserts a
// charge and keeps its id, a call phase that sends the derived key to the provider, and
// a tx phase whose response finishes the key. Register it on a workflow.Engine to run it.
func Example() {
	var chargeID = phases.NewSlot[int64]("charge_id")

	flow := phases.Flow{Name: "create_charge", Phases: []phases.Phase{
		phases.Tx("create_charge", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO charges (amount) VALUES ($1) RETURNING id`, 500).Scan(&id)
			if err != nil {
				return nil, err
			}
			return nil, chargeID.Set(run, id) // nil response: go on to the next phase
		}),
		phases.Call("provider_charge", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			// run.DerivedKey() is the same on every retry and in the sweeper.
			return nil, provider.Charge(ctx, run.DerivedKey(), 500)
		}),
		phases.Tx("finalize", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := chargeID.Get(run)
			if err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]int64{"id": id}) // a response finishes the key
		}),
	}}

	fmt.Println("valid:", flow.Validate() == nil)
	for _, p := range flow.Phases {
		fmt.Println(p.Kind, p.Name)
	}
	// Output:
	// valid: true
	// tx create_charge
	// call provider_charge
	// tx finalize
}
