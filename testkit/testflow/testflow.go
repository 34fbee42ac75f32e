// Package testflow is the one fake payment flow of idemflow's own tests: three phases
// (tx, call, tx) for the engine's, the sweeper's, the HTTP layer's, the CLI's, the
// operator page's and the OpenTelemetry tests, with a pay-first variant (call, tx;
// PayFirst) on the same tables; its call goes to an idemflowtest.Remote, which dedupes
// on the derived key. Its tables have no unique constraints on purpose: a duplicated
// effect shows up as an extra row. RunChild runs one request of it in a child process
// (testkit/childproc) that a test pauses or kills.
//
// This package imports idemflow's phases, workflow and idemflowtest packages and
// testkit/pgtest.
package testflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/phases"
)

// Name is the flow's name; Reserve, Pay and Settle are its phases.
const (
	Name    = "charge3"
	Reserve = "reserve"
	Pay     = "pay"
	Settle  = "settle"
)

// Schema creates the flow's effect tables in the current schema.
const Schema = `
CREATE TABLE ledger (
	id         bigserial PRIMARY KEY,
	scope      text   NOT NULL,
	idem_key   text   NOT NULL,
	amount     bigint NOT NULL,
	status     text   NOT NULL DEFAULT 'pending',
	payment_id text
);
CREATE TABLE settlements (
	id         bigserial PRIMARY KEY,
	ledger_id  bigint NOT NULL,
	payment_id text   NOT NULL
);`

// Exec runs statements; a pool or a connection.
type Exec interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateTables creates the effect tables.
func CreateTables(ctx context.Context, db Exec) error {
	_, err := db.Exec(ctx, Schema)
	return err
}

// Options configure the flow.
type Options struct {
	// ProviderURL is the fake provider's base URL.
	ProviderURL string
	// Before, if set, runs at the start of every phase function; an error it returns is
	// the phase's error. Tests use it to pause, count and inject failures.
	Before func(ctx context.Context, tx phases.DBTX, run *phases.Run) error
}

var (
	ledgerID  = phases.NewSlot[int64]("ledger_id")
	paymentID = phases.NewSlot[string]("payment_id")
)

type request struct {
	Amount int64 `json:"amount"`
}

// Answer is the flow's 201 body.
type Answer struct {
	LedgerID  int64  `json:"ledger_id"`
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
}

// Flow returns the flow.
func Flow(o Options) phases.Flow {
	before := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if o.Before == nil {
			return nil
		}
		return o.Before(ctx, tx, run)
	}
	client := &http.Client{}
	return phases.Flow{Name: Name, Phases: []phases.Phase{
		phases.Tx(Reserve, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if err := before(ctx, tx, run); err != nil {
				return nil, err
			}
			var req request
			if err := json.Unmarshal(run.Body(), &req); err != nil || req.Amount <= 0 {
				return nil, phases.Fail(&phases.Response{Status: 400, Body: []byte(`{"error":"amount must be a positive integer"}`)})
			}
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO ledger (scope, idem_key, amount) VALUES ($1, $2, $3) RETURNING id`,
				run.Scope(), run.Key(), req.Amount).Scan(&id)
			if err != nil {
				return nil, err
			}
			return nil, ledgerID.Set(run, id)
		}),
		phases.Call(Pay, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			if err := before(ctx, nil, run); err != nil {
				return nil, err
			}
			return nil, pay(ctx, client, o.ProviderURL, run)
		}),
		phases.Tx(Settle, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if err := before(ctx, tx, run); err != nil {
				return nil, err
			}
			lid, err := ledgerID.Get(run)
			if err != nil {
				return nil, err
			}
			pid, err := paymentID.Get(run)
			if err != nil {
				return nil, err
			}
			var amount int64
			err = tx.QueryRow(ctx, `UPDATE ledger SET status = 'settled', payment_id = $2 WHERE id = $1 RETURNING amount`, lid, pid).Scan(&amount)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO settlements (ledger_id, payment_id) VALUES ($1, $2)`, lid, pid); err != nil {
				return nil, err
			}
			resp, err := phases.JSON(http.StatusCreated, Answer{LedgerID: lid, PaymentID: pid, Amount: amount})
			if err != nil {
				return nil, err
			}
			resp.Header.Set("Location", "/ledger/"+strconv.FormatInt(lid, 10))
			resp.Header.Set("Set-Cookie", "session=secret")
			return resp, nil
		}),
	}}
}

// Effects counts a key's local effects.
type Effects struct {
	Ledger      int // ledger rows for the key
	Settled     int // of those, settled
	Settlements int // settlement rows for the key's ledger rows
}

// Querier reads rows; a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CountEffects counts the local effects of (scope, key).
func CountEffects(ctx context.Context, db Querier, scope, key string) (Effects, error) {
	var e Effects
	err := db.QueryRow(ctx, `
		SELECT count(*),
		       count(*) FILTER (WHERE l.status = 'settled'),
		       (SELECT count(*) FROM settlements s JOIN ledger l2 ON l2.id = s.ledger_id WHERE l2.scope = $1 AND l2.idem_key = $2)
		FROM ledger l WHERE l.scope = $1 AND l.idem_key = $2`, scope, key).Scan(&e.Ledger, &e.Settled, &e.Settlements)
	if err != nil {
		return e, fmt.Errorf("count effects: %w", err)
	}
	return e, nil
}

// ErrInjected is what Before hooks return to inject a failure.
var ErrInjected = errors.New("injected failure")

// pay is the Pay phase's call: the provider's /pay under the run's derived key; the
// payment id it answers goes in the run's data.
func pay(ctx context.Context, client *http.Client, providerURL string, run *phases.Run) error {
	var req request
	if err := json.Unmarshal(run.Body(), &req); err != nil {
		return err
	}
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, providerURL+"/pay", bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Idempotency-Key", run.DerivedKey())
	resp, err := client.Do(hreq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("provider answered %d: %s", resp.StatusCode, b)
	}
	var out struct{ ID string }
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	return paymentID.Set(run, out.ID)
}
