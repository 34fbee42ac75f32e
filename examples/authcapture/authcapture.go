// Package authcapture is a small example flow with two calls to a payment provider:
// an order is written, the amount authorised, then captured, and the order recorded as
// paid. Its test (authcapture_test.go) proves it crash-safe with idemflowtest in a few
// lines: the README shows them.
//
// This package imports idemflow's phases package.
package authcapture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemflow/idemflow/phases"
)

// Schema creates the flow's table.
const Schema = `CREATE TABLE orders (
	id         bigserial PRIMARY KEY,
	scope      text   NOT NULL,
	idem_key   text   NOT NULL,
	amount     bigint NOT NULL,
	status     text   NOT NULL DEFAULT 'pending',
	auth_id    text,
	capture_id text
)` // no unique constraint on (scope, idem_key): a duplicate shows up as a second row

var (
	orderID   = phases.NewSlot[int64]("order_id")
	authID    = phases.NewSlot[string]("auth_id")
	captureID = phases.NewSlot[string]("capture_id")
)

type request struct {
	Amount int64 `json:"amount"`
}

// Flow is the order flow against the provider at providerURL, which serves POST
// /authorize and POST /capture and dedupes on their Idempotency-Key header.
func Flow(providerURL string) phases.Flow {
	return phases.Flow{Name: "order", Phases: []phases.Phase{
		phases.Tx("create", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			var req request
			if err := json.Unmarshal(run.Body(), &req); err != nil || req.Amount <= 0 {
				return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", "amount must be positive", nil)
			}
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO orders (scope, idem_key, amount) VALUES ($1, $2, $3) RETURNING id`,
				run.Scope(), run.Key(), req.Amount).Scan(&id)
			if err != nil {
				return nil, err
			}
			return nil, orderID.Set(run, id)
		}),
		phases.Call("authorize", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			id, err := call(ctx, providerURL+"/authorize", run.DerivedKey(), run.Body())
			if err != nil {
				return nil, err
			}
			return nil, authID.Set(run, id)
		}),
		phases.Call("capture", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			auth, err := authID.Get(run)
			if err != nil {
				return nil, err
			}
			body, _ := json.Marshal(map[string]string{"authorization": auth})
			id, err := call(ctx, providerURL+"/capture", run.DerivedKey(), body)
			if err != nil {
				return nil, err
			}
			return nil, captureID.Set(run, id)
		}),
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := orderID.Get(run)
			if err != nil {
				return nil, err
			}
			auth, err := authID.Get(run)
			if err != nil {
				return nil, err
			}
			capture, err := captureID.Get(run)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', auth_id = $2, capture_id = $3 WHERE id = $1`, id, auth, capture); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, map[string]any{"order": id, "authorization": auth, "capture": capture})
		}),
	}}
}

// call POSTs body to url under the idempotency key and returns the id the provider
// answers with.
func call(ctx context.Context, url, key string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("provider answered %d: %s", resp.StatusCode, b)
	}
	var out struct{ ID string }
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		return "", errors.Join(fmt.Errorf("unreadable provider answer %q", b), err)
	}
	return out.ID, nil
}
