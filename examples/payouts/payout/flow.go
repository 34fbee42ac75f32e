package payout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/idemflow/idemflow/phases"
)

// The flow's name and phases. The names are stable: keys in flight resume by them.
const (
	FlowName      = "payout"
	PhaseRecord   = "record"
	PhaseTransfer = "bank_transfer"
	PhaseSettle   = "settle"
)

// Schema creates the consumer's tables in the current schema; it is idempotent. They
// have no unique constraint on the payout id on purpose: a payout run twice shows up
// as a second row instead of an error.
const Schema = `
CREATE TABLE IF NOT EXISTS payouts (
	id          bigserial   PRIMARY KEY,
	payout_id   text        NOT NULL,
	account_id  text        NOT NULL,
	amount      bigint      NOT NULL,
	currency    text        NOT NULL,
	status      text        NOT NULL DEFAULT 'pending',
	transfer_id text,
	created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS payouts_payout_idx ON payouts (payout_id);
CREATE TABLE IF NOT EXISTS ledger (
	id          bigserial PRIMARY KEY,
	payout_id   text      NOT NULL,
	account_id  text      NOT NULL,
	amount      bigint    NOT NULL,
	transfer_id text      NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_payout_idx ON ledger (payout_id);
-- Messages the consumer gave up on (terminated), one row per stream message, kept
-- until an operator deletes them: payouts dead-letters list / replay.
CREATE TABLE IF NOT EXISTS payout_dead_letters (
	id          bigserial   PRIMARY KEY,
	stream      text        NOT NULL,
	stream_seq  bigint      NOT NULL,
	subject     text        NOT NULL,
	msg_id      bytea       NOT NULL, -- Nats-Msg-Id, as sent (may be any bytes)
	data        bytea       NOT NULL, -- the message body, as sent
	reason      text        NOT NULL,
	delivered   bigint      NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	replays     int         NOT NULL DEFAULT 0,
	replayed_at timestamptz,
	UNIQUE (stream, stream_seq)
);`

// Requested is the body of a payouts.requested message. PayoutID is the business key:
// the same payout published twice, under any message id, is paid once.
type Requested struct {
	PayoutID string `json:"payout_id"`
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Paid is the flow's answer.
type Paid struct {
	PayoutID   string `json:"payout_id"`
	TransferID string `json:"transfer_id"`
	Amount     int64  `json:"amount"`
}

var currency = regexp.MustCompile(`^[a-z]{3}$`)

// Parse reads and checks a message body.
func Parse(body []byte) (Requested, error) {
	var r Requested
	if err := json.Unmarshal(body, &r); err != nil {
		return r, errors.New("body must be a JSON object with payout_id, account, amount and currency")
	}
	switch {
	case r.PayoutID == "" || len(r.PayoutID) > 200 || strings.ContainsRune(r.PayoutID, 0):
		// Any other text is fine: Key turns it into a valid idempotency key.
		return r, errors.New("payout_id must be 1-200 bytes of text without NUL")
	case r.Account == "" || strings.ContainsRune(r.Account, 0):
		return r, errors.New("account must be text without NUL, not empty")
	case r.Amount <= 0:
		return r, errors.New("amount must be a positive integer")
	case !currency.MatchString(r.Currency):
		return r, errors.New("currency must be three lowercase letters")
	}
	return r, nil
}

var (
	// requested is the message, parsed once per attempt by the first phase that asks.
	requested  = phases.NewBody(Parse)
	rowID      = phases.NewSlot[int64]("payout_row")
	transferID = phases.NewSlot[string]("transfer_id")
)

// Flow is the payout flow: record (tx), bank_transfer (call, with the derived key),
// settle (tx, answers). An invalid message is answered 400, stored like any answer.
func Flow(bank *BankClient) phases.Flow {
	return phases.Flow{Name: FlowName, Phases: []phases.Phase{
		phases.Tx(PhaseRecord, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			req, err := requested.Get(run)
			if err != nil {
				return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid payout", err.Error(), nil)
			}
			id, err := record(ctx, tx, req)
			if err != nil {
				return nil, err
			}
			return nil, rowID.Set(run, id)
		}),
		phases.Call(PhaseTransfer, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			req, err := requested.Get(run)
			if err != nil {
				return nil, err
			}
			id, err := bank.Transfer(ctx, run.DerivedKey(), req)
			if err != nil {
				return nil, phases.RetryLater(err, time.Second)
			}
			return nil, transferID.Set(run, id)
		}),
		phases.Tx(PhaseSettle, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := rowID.Get(run)
			if err != nil {
				return nil, err
			}
			tid, err := transferID.Get(run)
			if err != nil {
				return nil, err
			}
			paid, err := settle(ctx, tx, id, tid)
			if err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusOK, paid)
		}),
	}}
}

// record inserts the pending payout.
func record(ctx context.Context, tx phases.DBTX, req Requested) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `
		INSERT INTO payouts (payout_id, account_id, amount, currency) VALUES ($1, $2, $3, $4) RETURNING id`,
		req.PayoutID, req.Account, req.Amount, req.Currency).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record payout: %w", err)
	}
	return id, nil
}

// settle marks the payout paid and writes its ledger row: the effect that must exist
// exactly once per payout.
func settle(ctx context.Context, tx phases.DBTX, id int64, tid string) (Paid, error) {
	p := Paid{TransferID: tid}
	err := tx.QueryRow(ctx, `
		UPDATE payouts SET status = 'paid', transfer_id = $2 WHERE id = $1 RETURNING payout_id, amount`,
		id, tid).Scan(&p.PayoutID, &p.Amount)
	if err != nil {
		return p, fmt.Errorf("mark payout paid: %w", err)
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO ledger (payout_id, account_id, amount, transfer_id)
		SELECT payout_id, account_id, amount, transfer_id FROM payouts WHERE id = $1`, id)
	if err != nil {
		return p, fmt.Errorf("write ledger: %w", err)
	}
	return p, nil
}

// BankClient calls the bank.
type BankClient struct {
	BaseURL string
	HTTP    *http.Client
}

// Transfer asks the bank to move the money under key and returns the transfer's id.
// The bank makes one transfer per key, however often it is asked.
func (c *BankClient) Transfer(ctx context.Context, key string, req Requested) (string, error) {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/v1/transfers", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	hreq.Header.Set("Idempotency-Key", key)
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return "", fmt.Errorf("bank: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<14))
	if err != nil {
		return "", fmt.Errorf("bank: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("bank answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var out struct {
		Transfer string `json:"transfer"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Transfer == "" {
		return "", fmt.Errorf("bank: unreadable answer %q", b)
	}
	return out.Transfer, nil
}
