package phases_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemflow/idemflow/phases"
)

// Charge is the request of ExampleNewBody's flow.
type Charge struct {
	Amount int64 `json:"amount"`
}

// parseCharge decodes and checks a charge request: the same bytes give the same value
// or the same error on every attempt.
func parseCharge(body []byte) (Charge, error) {
	var c Charge
	if err := json.Unmarshal(body, &c); err != nil || c.Amount <= 0 {
		return c, errors.New("body must be a JSON object with a positive amount")
	}
	return c, nil
}

var request = phases.NewBody(parseCharge) // func([]byte) (Charge, error)

// A flow whose three phases each need the request reads it through one Body: the first
// phase of an attempt to ask parses it, and the others get what it got.
func ExampleNewBody() {
	flow := phases.Flow{Name: "create_charge", Phases: []phases.Phase{
		phases.Pipelined("create_charge", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			c, err := request.Get(run)
			if err != nil {
				return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
			}
			p.Queue(`INSERT INTO charges (id, amount) VALUES ($1, $2)`, "ch_"+run.ID(), c.Amount)
			return nil, nil
		}),
		phases.Call("provider_charge", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			c, err := request.Get(run)
			if err != nil {
				return nil, err
			}
			return nil, provider.Charge(ctx, run.DerivedKey(), c.Amount)
		}),
		phases.Tx("finalize", finalizeCharge),
	}}
	fmt.Println(flow.Name, len(flow.Phases))
	// Output: create_charge 3
}

// finalizeCharge is ExampleNewBody's last phase: it answers with the request it reads.
func finalizeCharge(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	req, err := request.Get(run) // in each phase: the attempt's first decoding
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE charges SET status = 'succeeded' WHERE id = $1`, "ch_"+run.ID()); err != nil {
		return nil, err
	}
	return phases.JSON(http.StatusCreated, req)
}
