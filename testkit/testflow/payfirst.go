package testflow

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/idemflow/idemflow/phases"
)

// PayFirstName is the name of the flow's pay-first variant; PayFirstCharge and
// PayFirstRecord are its phases.
const (
	PayFirstName   = "payfirst"
	PayFirstCharge = "charge"
	PayFirstRecord = "record"
)

// PayFirst returns the pay-first variant of the flow: a call phase first (the same
// payment under the run's derived key, so a new key's claim commits alone), then a tx
// phase that writes the ledger row, settled, and its settlement. It uses the same
// tables and Answer, so that RequireOneEffect and CountEffects check it too.
func PayFirst(o Options) phases.Flow {
	before := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if o.Before == nil {
			return nil
		}
		return o.Before(ctx, tx, run)
	}
	client := &http.Client{}
	return phases.Flow{Name: PayFirstName, Phases: []phases.Phase{
		phases.Call(PayFirstCharge, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if err := before(ctx, nil, run); err != nil {
				return nil, err
			}
			return nil, pay(ctx, client, o.ProviderURL, run)
		}),
		phases.Tx(PayFirstRecord, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if err := before(ctx, tx, run); err != nil {
				return nil, err
			}
			pid, err := paymentID.Get(run)
			if err != nil {
				return nil, err
			}
			var req request
			if err := json.Unmarshal(run.Body(), &req); err != nil {
				return nil, err
			}
			var lid int64
			err = tx.QueryRow(ctx, `INSERT INTO ledger (scope, idem_key, amount, status, payment_id)
				VALUES ($1, $2, $3, 'settled', $4) RETURNING id`, run.Scope(), run.Key(), req.Amount, pid).Scan(&lid)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO settlements (ledger_id, payment_id) VALUES ($1, $2)`, lid, pid); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, Answer{LedgerID: lid, PaymentID: pid, Amount: req.Amount})
		}),
	}}
}
