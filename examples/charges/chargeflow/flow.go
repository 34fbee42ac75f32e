package chargeflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/phases"
)

// The charges flow's name and phases. The names are stable: keys in flight resume by them.
const (
	FlowName      = "create_charge"
	PhaseCreate   = "create_charge"
	PhaseProvider = "provider_charge"
	PhaseFinalize = "finalize"
)

// Schema creates the example's charges table in the current schema; it is idempotent.
// The account is in the primary key, so that the table can be distributed by account
// on Citus, colocated with idemflow's keys (whose scope is the account): see
// DistributionColumn.
const Schema = `
CREATE TABLE IF NOT EXISTS charges (
	id                  text        NOT NULL DEFAULT 'ch_' || replace(gen_random_uuid()::text, '-', ''),
	account_id          text        NOT NULL,
	idempotency_key     text        NOT NULL,
	amount              bigint      NOT NULL CHECK (amount > 0),
	currency            text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
	source              text        NOT NULL CHECK (source <> ''),
	status              text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
	provider_payment_id text,
	created_at          timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (account_id, id)
);
CREATE INDEX IF NOT EXISTS charges_account_idx ON charges (account_id, created_at);`

// Table and DistributionColumn name the charges table and the column it is
// distributed by on Citus: the account, which the API uses as the idempotency scope.
const (
	Table              = "charges"
	DistributionColumn = "account_id"
)

// Request is the body of POST /v1/charges.
type Request struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Source   string `json:"source"`
}

// Charge is a charge as the API shows it.
type Charge struct {
	ID                string  `json:"id"`
	Amount            int64   `json:"amount"`
	Currency          string  `json:"currency"`
	Source            string  `json:"source"`
	Status            string  `json:"status"`
	ProviderPaymentID *string `json:"provider_payment_id"`
}

var currencyRE = regexp.MustCompile(`^[a-z]{3}$`)

// ParseRequest validates a request body. Its error messages are deterministic, so a
// retry of an invalid request gets the same bytes.
func ParseRequest(body []byte) (Request, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, errors.New("body must be a JSON object with amount, currency and source")
	}
	if dec.More() {
		return req, errors.New("body must hold exactly one JSON object")
	}
	switch {
	case req.Amount <= 0:
		return req, errors.New("amount must be a positive integer")
	case !currencyRE.MatchString(req.Currency):
		return req, errors.New("currency must be three lowercase letters")
	case req.Source == "" || len(req.Source) > 255 || strings.ContainsRune(req.Source, 0):
		// A NUL ("\u0000" in JSON) is text Postgres refuses to store: a 400, not a 500.
		return req, errors.New("source must be 1-255 bytes of text without NUL")
	}
	return req, nil
}

var (
	// request is the charge request, parsed once per attempt by the first phase that
	// asks.
	request   = phases.NewBody(ParseRequest)
	chargeID  = phases.NewSlot[string]("charge_id")
	paymentID = phases.NewSlot[string]("provider_payment_id")
	declined  = phases.NewSlot[string]("decline_reason")
)

// Flow is the payments flow with Go-code tx phases: insert a pending charge, ask the
// provider with the derived key, record the outcome and answer. It costs 6 round trips
// for a new charge; PipelinedFlow is the same flow in 3.
func Flow(provider *ProviderClient) phases.Flow {
	return phases.Flow{Name: FlowName, Phases: []phases.Phase{goCreate(), providerPhase(provider), goFinalize(nil)}}
}

// PipelinedFlow is Flow with pipelined tx phases (phases.Pipelined): each sends its
// statement with the engine's BEGIN, claim or fence, key row write and COMMIT in one
// round trip, so that a new charge costs 3 (the key's look-up and one per tx phase)
// and 2 commits. It stores the same rows and answers the same bytes as Flow.
func PipelinedFlow(provider *ProviderClient) phases.Flow {
	return phases.Flow{Name: FlowName, Phases: []phases.Phase{pipeCreate(), providerPhase(provider), pipeFinalize()}}
}

// Receipts enqueues the receipt of an account's succeeded charge in tx, the finalize
// phase's own transaction (seen as a pgx.Tx): the job commits if and only if the
// charge does.
type Receipts func(ctx context.Context, tx pgx.Tx, account string, c Charge) error

// FlowWithReceipts is the example server's flow: PipelinedFlow whose finalize phase,
// when receipts is not nil, also enqueues a receipt for each succeeded charge through
// receipts (a transactional outbox). That finalize is a Go-code tx phase, since River's
// InsertTx needs the transaction itself; the two shapes mix in one flow. A nil receipts
// is PipelinedFlow.
func FlowWithReceipts(provider *ProviderClient, receipts Receipts) phases.Flow {
	if receipts == nil {
		return PipelinedFlow(provider)
	}
	return phases.Flow{Name: FlowName, Phases: []phases.Phase{pipeCreate(), providerPhase(provider), goFinalize(receipts)}}
}

// goCreate inserts the pending charge, the database choosing its id.
func goCreate() phases.Phase {
	return phases.Tx(PhaseCreate, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		req, err := request.Get(run)
		if err != nil {
			return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
		}
		var id string
		err = tx.QueryRow(ctx, `
				INSERT INTO charges (account_id, idempotency_key, amount, currency, source)
				VALUES ($1, $2, $3, $4, $5) RETURNING id`,
			run.Scope(), run.Key(), req.Amount, req.Currency, req.Source).Scan(&id)
		if err != nil {
			return nil, fmt.Errorf("insert charge: %w", err)
		}
		return nil, chargeID.Set(run, id)
	})
}

// ChargeID is the id of the charge of key row id: derived from the key row's
// identity, unique across scopes and never reused, so a pipelined phase knows it
// before anything is sent. It has the shape of the ids the charges table makes.
func ChargeID(keyRowID string) string { return "ch_" + strings.ReplaceAll(keyRowID, "-", "") }

// pipeCreate inserts the pending charge in the round trip of the engine's claim and
// commit: its id and the phase data are known up front.
func pipeCreate() phases.Phase {
	return phases.Pipelined(PhaseCreate, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		req, err := request.Get(run)
		if err != nil {
			return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
		}
		id := ChargeID(run.ID())
		p.Queue(`INSERT INTO charges (id, account_id, idempotency_key, amount, currency, source)
			VALUES ($1, $2, $3, $4, $5, $6)`, id, run.Scope(), run.Key(), req.Amount, req.Currency, req.Source)
		return nil, chargeID.Set(run, id)
	})
}

// providerPhase asks the provider for the payment, under the derived key.
func providerPhase(provider *ProviderClient) phases.Phase {
	return phases.Call(PhaseProvider, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
		req, err := request.Get(run)
		if err != nil {
			return nil, err
		}
		pay, err := provider.Pay(ctx, run.DerivedKey(), req)
		var dec *DeclinedError
		switch {
		case errors.As(err, &dec):
			return nil, declined.Set(run, dec.Reason)
		case err != nil:
			return nil, phases.RetryLater(fmt.Errorf("provider: %w", err), time.Second)
		}
		return nil, paymentID.Set(run, pay)
	})
}

// pipeFinalize records the provider's outcome and answers, in one round trip: the
// answer is known up front (the charge is the request's, under the id create_charge
// chose). The update cannot miss: create_charge inserted the row in the transaction
// that made the key durable, and nothing else writes it.
func pipeFinalize() phases.Phase {
	return phases.Pipelined(PhaseFinalize, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		id, err := chargeID.Get(run)
		if err != nil {
			return nil, err
		}
		reason, wasDeclined, err := declined.Lookup(run)
		if err != nil {
			return nil, err
		}
		if wasDeclined {
			p.Queue(`UPDATE charges SET status = 'failed' WHERE id = $1 AND account_id = $2`, id, run.Scope())
			return phases.Problem(http.StatusPaymentRequired, "", "card declined", reason, nil)
		}
		pay, err := paymentID.Get(run)
		if err != nil {
			return nil, err
		}
		req, err := request.Get(run)
		if err != nil {
			return nil, err
		}
		p.Queue(`UPDATE charges SET status = 'succeeded', provider_payment_id = $3 WHERE id = $1 AND account_id = $2`, id, run.Scope(), pay)
		return created(Charge{ID: id, Amount: req.Amount, Currency: req.Currency, Source: req.Source, Status: "succeeded", ProviderPaymentID: &pay})
	})
}

// created is the answer for a succeeded charge.
func created(c Charge) (*phases.Response, error) {
	resp, err := phases.JSON(http.StatusCreated, c)
	if err != nil {
		return nil, err
	}
	resp.Header.Set("Location", "/v1/charges/"+c.ID)
	return resp, nil
}

// goFinalize records the provider's outcome and answers, enqueuing a receipt through
// receipts when it is not nil.
func goFinalize(receipts Receipts) phases.Phase {
	return phases.Tx(PhaseFinalize, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		id, err := chargeID.Get(run)
		if err != nil {
			return nil, err
		}
		reason, wasDeclined, err := declined.Lookup(run)
		if err != nil {
			return nil, err
		}
		if wasDeclined {
			if _, err := tx.Exec(ctx, `UPDATE charges SET status = 'failed' WHERE id = $1 AND account_id = $2`, id, run.Scope()); err != nil {
				return nil, fmt.Errorf("mark charge failed: %w", err)
			}
			return phases.Problem(http.StatusPaymentRequired, "", "card declined", reason, nil)
		}
		pay, err := paymentID.Get(run)
		if err != nil {
			return nil, err
		}
		c, err := ScanCharge(tx.QueryRow(ctx, `
				UPDATE charges SET status = 'succeeded', provider_payment_id = $3
				WHERE id = $1 AND account_id = $2
				RETURNING id, amount, currency, source, status, provider_payment_id`, id, run.Scope(), pay))
		if err != nil {
			return nil, fmt.Errorf("mark charge succeeded: %w", err)
		}
		if receipts != nil {
			if err := receipts(ctx, tx.(pgx.Tx), run.Scope(), c); err != nil {
				return nil, fmt.Errorf("enqueue receipt: %w", err)
			}
		}
		return created(c)
	})
}

// ScanCharge reads a charge selected as id, amount, currency, source, status,
// provider_payment_id.
func ScanCharge(row pgx.Row) (Charge, error) {
	var c Charge
	err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.Source, &c.Status, &c.ProviderPaymentID)
	return c, err
}

// DeclinedError is the provider's deterministic refusal.
type DeclinedError struct{ Reason string }

func (e *DeclinedError) Error() string { return "declined: " + e.Reason }

// ProviderClient calls the payment provider.
type ProviderClient struct {
	BaseURL string
	HTTP    *http.Client
}

// Pay asks for a payment under key and returns the payment id. A 402 is a
// *DeclinedError; anything else unexpected is an error worth retrying.
func (p *ProviderClient) Pay(ctx context.Context, key string, req Request) (string, error) {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.BaseURL+"/v1/payments", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", key)
	resp, err := p.HTTP.Do(hreq)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", err
	}
	switch resp.StatusCode {
	case http.StatusCreated:
		var out struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
			return "", fmt.Errorf("unreadable provider answer %q", b)
		}
		return out.ID, nil
	case http.StatusPaymentRequired:
		var out struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &out)
		if out.Error == "" {
			out.Error = "card_declined"
		}
		return "", &DeclinedError{Reason: out.Error}
	default:
		return "", fmt.Errorf("provider answered %s", strconv.Itoa(resp.StatusCode))
	}
}
