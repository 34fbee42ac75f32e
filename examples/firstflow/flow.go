package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemflow/idemflow/phases"
)

// Schema is the service's own tables: accounts with a balance, the withdrawals, and a
// ledger that records every movement of money, so that a test (or an auditor) can
// count them.
const Schema = `
CREATE TABLE accounts (
	id      text   PRIMARY KEY,
	balance bigint NOT NULL CHECK (balance >= 0)
);
CREATE TABLE withdrawals (
	id         text   PRIMARY KEY,
	account_id text   NOT NULL REFERENCES accounts (id),
	idem_key   text   NOT NULL,
	amount     bigint NOT NULL,
	iban       text   NOT NULL,
	status     text   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'refused')),
	bank_ref   text,
	refusal    text
);
CREATE TABLE ledger (
	withdrawal_id text   NOT NULL REFERENCES withdrawals (id),
	amount        bigint NOT NULL,
	what          text   NOT NULL
);`

// The flow's name and phase names: stored on every key, so never renamed.
const (
	flowName    = "withdraw"
	phaseDebit  = "debit"
	phaseBank   = "bank_transfer"
	phaseSettle = "settle"
	// compUndo is the compensation an operator's cancel runs (cancelWithdrawal).
	compUndo = "undo_withdrawal"
)

// Phase data: what one phase hands to the next, stored with the key's recovery point.
var (
	withdrawalID = phases.NewSlot[string]("withdrawal_id")
	bankRef      = phases.NewSlot[string]("bank_ref")
	refusal      = phases.NewSlot[string]("refusal")
)

// withdrawalRequest is the body of POST /v1/withdrawals.
type withdrawalRequest struct {
	Amount int64  `json:"amount"`
	IBAN   string `json:"iban"`
}

// withdrawalFlow moves money out of an account: debit it (tx), ask the bank to
// transfer (call), then record the outcome and answer (tx). An operator's cancel of a
// key runs its compensation, which gives the money back.
func withdrawalFlow(b *bank) phases.Flow {
	return phases.Flow{Name: flowName, Phases: []phases.Phase{
		phases.Tx(phaseDebit, debit),
		phases.Call(phaseBank, b.transfer),
		phases.Tx(phaseSettle, settle),
	}, Compensation: phases.Compensate(compUndo, cancelWithdrawal)}
}

// debit is a tx phase: its statements and the key's new recovery point commit
// together, once, or not at all.
func debit(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	var req withdrawalRequest
	if err := json.Unmarshal(run.Body(), &req); err != nil || req.Amount <= 0 || req.IBAN == "" {
		// A final answer: stored and replayed; this phase's writes roll back.
		return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", "amount (a positive integer) and iban are required", nil)
	}
	tag, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2`, run.Scope(), req.Amount)
	if err != nil {
		return nil, err // transient: rolled back, nothing stored, run again later
	}
	if tag.RowsAffected() == 0 {
		return nil, phases.FailProblem(http.StatusUnprocessableEntity, "", "insufficient funds", "", nil)
	}
	id := "wd_" + run.ID() // the key row's id: the same in every run of this key
	if _, err := tx.Exec(ctx, `INSERT INTO withdrawals (id, account_id, idem_key, amount, iban) VALUES ($1, $2, $3, $4, $5)`,
		id, run.Scope(), run.Key(), req.Amount, req.IBAN); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (withdrawal_id, amount, what) VALUES ($1, $2, 'debit')`, id, -req.Amount); err != nil {
		return nil, err
	}
	return nil, withdrawalID.Set(run, id) // no answer yet: go on to the next phase
}

// transfer is a call phase: no transaction is open while it runs. It runs at least
// once, and again after any failure or crash before settle commits, always with the
// same derived key, on which the bank dedupes.
func (b *bank) transfer(ctx context.Context, run *phases.Run) (*phases.Response, error) {
	ref, err := b.send(ctx, run.DerivedKey(), run.Body())
	var refused *refusedError
	switch {
	case errors.As(err, &refused):
		// A final no, after debit committed: record it for settle to undo. Answering
		// here (phases.Fail) would finish the key with the account still debited.
		return nil, refusal.Set(run, refused.reason)
	case err != nil:
		// No answer, or a 5xx: the transfer may or may not have happened. Transient:
		// the key is released at debit and this call runs again, with the same key.
		return nil, phases.RetryLater(fmt.Errorf("bank: %w", err), 5*time.Second)
	}
	return nil, bankRef.Set(run, ref)
}

// settle is the last tx phase: it records the bank's answer and answers the client.
// When the bank refused, it is the compensation: it undoes debit in its own
// transaction, which commits once, with the answer.
func settle(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	id, err := withdrawalID.Get(run)
	if err != nil {
		return nil, err
	}
	reason, refusedByBank, err := refusal.Lookup(run)
	if err != nil {
		return nil, err
	}
	if refusedByBank {
		if err := undoWithdrawal(ctx, tx, id, reason); err != nil {
			return nil, err
		}
		return phases.Problem(http.StatusPaymentRequired, "", "transfer refused", reason, map[string]any{"withdrawal": id})
	}
	ref, err := bankRef.Get(run)
	if err != nil {
		return nil, err
	}
	var amount int64
	err = tx.QueryRow(ctx, `UPDATE withdrawals SET status = 'sent', bank_ref = $2 WHERE id = $1 RETURNING amount`,
		id, ref).Scan(&amount)
	if err != nil {
		return nil, err
	}
	return phases.JSON(http.StatusCreated, map[string]any{"id": id, "amount": amount, "status": "sent", "bank_ref": ref})
}

// undoWithdrawal gives a pending withdrawal's money back and marks it refused, on tx:
// settle's transaction, or an operator's own after a cancelled key (docs/FIRST-FLOW.md).
// It refuses a withdrawal that is not pending, so that it never gives money back twice.
func undoWithdrawal(ctx context.Context, tx phases.DBTX, id, reason string) error {
	var account string
	var amount int64
	err := tx.QueryRow(ctx, `UPDATE withdrawals SET status = 'refused', refusal = $2
		WHERE id = $1 AND status = 'pending' RETURNING account_id, amount`, id, reason).Scan(&account, &amount)
	if err != nil {
		return fmt.Errorf("withdrawal %s is not pending: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, account, amount); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO ledger (withdrawal_id, amount, what) VALUES ($1, $2, 'refund')`, id, amount)
	return err
}

// cancelWithdrawal is the flow's compensation: an operator's cancel of a key runs it
// in the cancel's own transaction, fenced like a phase, with the recovery point the key
// reached, so the money comes back exactly when the key is cancelled. Before debit
// committed there is nothing to undo; after it, the withdrawal is still pending (settle
// has not committed, or the key would be finished and not cancellable).
func cancelWithdrawal(ctx context.Context, tx phases.DBTX, run *phases.Run, reached string) error {
	if reached == phases.Started {
		return nil
	}
	id, err := withdrawalID.Get(run)
	if err != nil {
		return err
	}
	return undoWithdrawal(ctx, tx, id, "cancelled by the operator")
}

// bank is the client of the bank's transfer API, which dedupes on the Idempotency-Key
// header (idemflowtest.Remote in the tests).
type bank struct {
	url  string
	http *http.Client
}

// refusedError is the bank's final no (HTTP 402).
type refusedError struct{ reason string }

func (e *refusedError) Error() string { return "refused: " + e.reason }

// send asks the bank for a transfer under key and returns its reference.
func (b *bank) send(ctx context.Context, key string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/transfers", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := b.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct{ ID, Error string }
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err == nil {
		err = json.Unmarshal(raw, &out)
	}
	switch {
	case resp.StatusCode == http.StatusPaymentRequired:
		return "", &refusedError{reason: out.Error}
	case resp.StatusCode != http.StatusCreated || err != nil || out.ID == "":
		return "", fmt.Errorf("bank answered %d %q", resp.StatusCode, raw)
	}
	return out.ID, nil
}
