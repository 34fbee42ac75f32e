package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// The two flows every experiment runs: the charges example's (tx, call, tx) and a flow
// with two call phases, the first one before any tx phase (so its claim commits alone):
// authorize (call), reserve (tx), capture (call), settle (tx).
const (
	twoCallFlow     = "two_call"
	phaseAuthorize  = "authorize"
	phaseReserve    = "reserve"
	phaseCapture    = "capture"
	phaseSettle     = "settle"
	twoCallRoute    = "/v1/orders"
	chargesRoute    = "/v1/charges"
	effectsSchemaV1 = chargeflow.Schema + `;
CREATE TABLE orders (
	id         bigserial PRIMARY KEY,
	scope      text   NOT NULL,
	idem_key   text   NOT NULL,
	amount     bigint NOT NULL,
	auth_id    text   NOT NULL,
	capture_id text,
	status     text   NOT NULL DEFAULT 'authorized'
);
` + ledgerSchema + mwSchema + payout.Schema
)

// flowPhases is each flow's phase order, for the audit of recovery points.
var flowPhases = map[string][]string{
	chargeflow.FlowName:       {chargeflow.PhaseCreate, chargeflow.PhaseProvider, chargeflow.PhaseFinalize},
	twoCallFlow:               {phaseAuthorize, phaseReserve, phaseCapture, phaseSettle},
	ledgerFlow:                {phaseDebit, phaseNotify, phasePost},
	payout.FlowName:           {payout.PhaseRecord, payout.PhaseTransfer, payout.PhaseSettle},
	idemhttp.MiddlewareFlow:   {"handle"},
	idemhttp.TxMiddlewareFlow: {"handle"},
}

// flowCalls names each flow's call phases.
var flowCalls = map[string][]string{
	chargeflow.FlowName: {chargeflow.PhaseProvider},
	twoCallFlow:         {phaseAuthorize, phaseCapture},
	ledgerFlow:          {phaseNotify},
}

// effectCounts counts each key's effect rows, per flow: the charges row, the order row.
var effectCounts = map[string]string{
	chargeflow.FlowName:       `SELECT account_id, idempotency_key, count(*) FROM charges GROUP BY 1, 2`,
	twoCallFlow:               `SELECT scope, idem_key, count(*) FROM orders GROUP BY 1, 2`,
	ledgerFlow:                `SELECT scope, idem_key, count(*) FROM side_ledger GROUP BY 1, 2`,
	payout.FlowName:           `SELECT 'payouts/' || account_id, payout_id, count(*) FROM ledger GROUP BY 1, 2`, // payout.Scope of plain accounts
	idemhttp.MiddlewareFlow:   `SELECT scope, idem_key, count(*) FROM mw_effects WHERE kind = 'plain' GROUP BY 1, 2`,
	idemhttp.TxMiddlewareFlow: `SELECT scope, idem_key, count(*) FROM mw_effects WHERE kind = 'tx' GROUP BY 1, 2`,
}

var (
	authID    = phases.NewSlot[string]("auth_id")
	captureID = phases.NewSlot[string]("capture_id")
	orderID   = phases.NewSlot[int64]("order_id")
)

// settleIDs reads what the two-call flow's settle needs from the earlier phases.
func settleIDs(run *phases.Run) (oid int64, auth, capt string, err error) {
	if oid, err = orderID.Get(run); err != nil {
		return 0, "", "", err
	}
	if auth, err = authID.Get(run); err != nil {
		return 0, "", "", err
	}
	if capt, err = captureID.Get(run); err != nil {
		return 0, "", "", err
	}
	return oid, auth, capt, nil
}

type orderRequest struct {
	Amount int64 `json:"amount"`
	// SlowMillis makes the reserve phase sleep that long in SQL on the key's first
	// attempt (to make a statement timeout fire).
	SlowMillis int `json:"slow_ms,omitempty"`
	// TimeoutMillis, with SlowMillis, is the statement_timeout the reserve phase sets
	// for its own transaction (SET LOCAL) before it sleeps: the timeout fires there and
	// nowhere else, however slow the machine makes the engine's other statements.
	TimeoutMillis int `json:"statement_timeout_ms,omitempty"`
}

// orderAnswer is the two-call flow's 201 body.
type orderAnswer struct {
	OrderID   int64  `json:"order_id"`
	AuthID    string `json:"auth_id"`
	CaptureID string `json:"capture_id"`
	Amount    int64  `json:"amount"`
}

// providerRefused is a provider's answer other than 201.
type providerRefused struct {
	status int
	body   []byte
}

func (e *providerRefused) Error() string {
	return fmt.Sprintf("provider answered %d: %s", e.status, e.body)
}

// providerCall asks the provider at url for a payment of amount under the
// idempotency key and returns its id. An answer other than 201 is a
// *providerRefused, wrapped to be retried a second later.
func providerCall(ctx context.Context, client *http.Client, url, key string, amount int64) (string, error) {
	body, _ := json.Marshal(map[string]int64{"amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return "", phases.RetryLater(&providerRefused{status: resp.StatusCode, body: b}, time.Second)
	}
	var out struct{ ID string }
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		return "", fmt.Errorf("unreadable provider answer %q", b)
	}
	return out.ID, nil
}

// newTwoCallFlow returns the two-call flow on the provider at base.
func newTwoCallFlow(base string, client *http.Client) phases.Flow {
	call := func(ctx context.Context, path, key string, amount int64) (string, error) {
		return providerCall(ctx, client, base+path, key, amount)
	}
	parse := func(run *phases.Run) (orderRequest, error) {
		var r orderRequest
		if err := json.Unmarshal(run.Body(), &r); err != nil || r.Amount <= 0 {
			return r, phases.Fail(&phases.Response{Status: 400, Body: []byte(`{"error":"amount must be positive"}`)})
		}
		return r, nil
	}
	return phases.Flow{Name: twoCallFlow, Phases: []phases.Phase{
		phases.Call(phaseAuthorize, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			r, err := parse(run)
			if err != nil {
				return nil, err
			}
			id, err := call(ctx, "/v1/authorize", run.DerivedKey(), r.Amount)
			if err != nil {
				return nil, err
			}
			return nil, authID.Set(run, id)
		}),
		phases.Tx(phaseReserve, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			r, err := parse(run)
			if err != nil {
				return nil, err
			}
			auth, err := authID.Get(run)
			if err != nil {
				return nil, err
			}
			if r.SlowMillis > 0 && run.Attempt() == 1 {
				if r.TimeoutMillis > 0 {
					if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, strconv.Itoa(r.TimeoutMillis)); err != nil {
						return nil, err
					}
				}
				if _, err := tx.Exec(ctx, `SELECT pg_sleep($1::float8 / 1000)`, r.SlowMillis); err != nil {
					return nil, err
				}
			}
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO orders (scope, idem_key, amount, auth_id) VALUES ($1, $2, $3, $4) RETURNING id`,
				run.Scope(), run.Key(), r.Amount, auth).Scan(&id); err != nil {
				return nil, err
			}
			return nil, orderID.Set(run, id)
		}),
		phases.Call(phaseCapture, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			r, err := parse(run)
			if err != nil {
				return nil, err
			}
			id, err := call(ctx, "/v1/capture", run.DerivedKey(), r.Amount)
			if err != nil {
				return nil, err
			}
			return nil, captureID.Set(run, id)
		}),
		phases.Tx(phaseSettle, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			oid, auth, capt, err := settleIDs(run)
			if err != nil {
				return nil, err
			}
			var amount int64
			if err := tx.QueryRow(ctx, `UPDATE orders SET status = 'captured', capture_id = $2 WHERE id = $1 AND scope = $3 RETURNING amount`,
				oid, capt, run.Scope()).Scan(&amount); err != nil {
				return nil, err
			}
			resp, err := phases.JSON(http.StatusCreated, orderAnswer{OrderID: oid, AuthID: auth, CaptureID: capt, Amount: amount})
			if err != nil {
				return nil, err
			}
			resp.Header.Set("Location", "/v1/orders/"+strconv.FormatInt(oid, 10))
			return resp, nil
		}),
	}}
}

// registerFlows registers both flows on e, calling the provider at base, with first
// (if not nil) as the prologue of each flow's first phase when that is a Go-code tx
// phase, and the ledger flow too when side is not nil. With pipelined, the charges
// flow is chargeflow.PipelinedFlow (same name, phases, rows and answers; each tx
// phase one round trip, its claim or fence sent first) and the two-call flow's tx
// phases are pipelined ones that read their statements' results (two round trips,
// the transaction open between them: see pipelineTwoCall); the ledger flow stays
// Go-code. With shape.ReadAtClaim too, the charges flow's create_charge also reads a
// result (readAtClaim), so that it takes two round trips with the claim in the first.
func registerFlows(e *workflow.Engine, base string, client *http.Client, first txPrologue, side *sideRun, shape flowShape) error {
	charges, twoCall := chargeflow.Flow(&chargeflow.ProviderClient{BaseURL: base, HTTP: client}), newTwoCallFlow(base, client)
	if shape.Pipelined {
		charges, twoCall = chargeflow.PipelinedFlow(&chargeflow.ProviderClient{BaseURL: base, HTTP: client}), pipelineTwoCall(twoCall)
		if shape.ReadAtClaim {
			charges = readAtClaim(charges)
		}
	}
	if err := e.Register(withFirstTxPrologue(charges, first)); err != nil {
		return err
	}
	if side != nil {
		if err := e.Register(withFirstTxPrologue(newLedgerFlow(side, base, client), first)); err != nil {
			return err
		}
	}
	return e.Register(withFirstTxPrologue(twoCall, first))
}

// pipelineTwoCall returns the two-call flow f with its tx phases, reserve and settle,
// as pipelined phases that read their statements' results: each is two round trips,
// the first with BEGIN, the fence and the phase's statement, the second with the key
// row's write and COMMIT, the transaction open between them (the phases' BeforeCommit
// boundary). Same rows, data and answers as f's Go-code phases.
func pipelineTwoCall(f phases.Flow) phases.Flow {
	out := f
	out.Phases = nil
	for _, ph := range f.Phases {
		switch ph.Name {
		case phaseReserve:
			ph = pipeReserve()
		case phaseSettle:
			ph = pipeSettle()
		}
		out.Phases = append(out.Phases, ph)
	}
	return out
}

// parseOrder reads a two-call flow's request.
func parseOrder(run *phases.Run) (orderRequest, error) {
	var r orderRequest
	if err := json.Unmarshal(run.Body(), &r); err != nil || r.Amount <= 0 {
		return r, phases.Fail(&phases.Response{Status: 400, Body: []byte(`{"error":"amount must be positive"}`)})
	}
	return r, nil
}

// pipeReserve is the two-call flow's reserve as a pipelined phase: the order's id
// comes back from its INSERT, so the phase data is set by Then.
func pipeReserve() phases.Phase {
	return phases.Pipelined(phaseReserve, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		r, err := parseOrder(run)
		if err != nil {
			return nil, err
		}
		auth, err := authID.Get(run)
		if err != nil {
			return nil, err
		}
		if r.SlowMillis > 0 && run.Attempt() == 1 {
			if r.TimeoutMillis > 0 {
				p.Queue(`SELECT set_config('statement_timeout', $1, true)`, strconv.Itoa(r.TimeoutMillis))
			}
			p.Queue(`SELECT pg_sleep($1::float8 / 1000)`, r.SlowMillis)
		}
		var id int64
		p.Queue(`INSERT INTO orders (scope, idem_key, amount, auth_id) VALUES ($1, $2, $3, $4) RETURNING id`,
			run.Scope(), run.Key(), r.Amount, auth).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
		p.Then(func(run *phases.Run) (*phases.Response, error) { return nil, orderID.Set(run, id) })
		return nil, nil
	})
}

// pipeSettle is the two-call flow's settle as a pipelined phase: the answer names the
// amount its UPDATE returns, so Then makes it.
func pipeSettle() phases.Phase {
	return phases.Pipelined(phaseSettle, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		oid, auth, capt, err := settleIDs(run)
		if err != nil {
			return nil, err
		}
		var amount int64
		p.Queue(`UPDATE orders SET status = 'captured', capture_id = $2 WHERE id = $1 AND scope = $3 RETURNING amount`,
			oid, capt, run.Scope()).QueryRow(func(row pgx.Row) error { return row.Scan(&amount) })
		p.Then(func(*phases.Run) (*phases.Response, error) {
			resp, err := phases.JSON(http.StatusCreated, orderAnswer{OrderID: oid, AuthID: auth, CaptureID: capt, Amount: amount})
			if err != nil {
				return nil, err
			}
			resp.Header.Set("Location", "/v1/orders/"+strconv.FormatInt(oid, 10))
			return resp, nil
		})
		return nil, nil
	})
}

// txPrologue runs in a tx phase's transaction before the phase's own function; an
// error it returns is the phase's.
type txPrologue func(ctx context.Context, tx phases.DBTX, run *phases.Run) error

// withFirstTxPrologue returns f with fn run at the start of its first phase, if that
// is a tx phase (its isolation level kept). For a new key that is right after the
// claim: the engine calls a new key's first tx phase only once the claim lock is held
// and the key row was found absent, and inserts the row at the phase's commit. A flow
// that calls first (the two-call flow) is returned as it is: its claim and key row
// commit alone, before the call.
//
// A pipelined first phase is returned as it is too: it has no Go code to wrap, and its
// claim is sent with its statements, so there is no point at which the claim is held
// and nothing of the phase has run. The experiments that use a prologue (claim_test.go)
// run on Go-code flows only.
func withFirstTxPrologue(f phases.Flow, fn txPrologue) phases.Flow {
	if fn == nil || len(f.Phases) == 0 || f.Phases[0].Kind != phases.KindTx || f.Phases[0].Pipeline != nil {
		return f
	}
	first := f.Phases[0]
	wrapped := phases.Tx(first.Name, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		if err := fn(ctx, tx, run); err != nil {
			return nil, err
		}
		return first.TxFunc(ctx, tx, run)
	})
	wrapped.IsoLevel = first.IsoLevel
	f.Phases = append([]phases.Phase{wrapped}, f.Phases[1:]...)
	return f
}

// request builds the request of key i of flow.
func request(scope, key, flow string, amount int64) workflow.Request {
	switch flow {
	case ledgerFlow:
		return workflow.Request{Scope: scope, Key: key, Flow: ledgerFlow, Method: http.MethodPost, Route: ledgerRoute,
			Body: []byte(fmt.Sprintf(`{"amount":%d}`, amount))}
	case twoCallFlow:
		return workflow.Request{Scope: scope, Key: key, Flow: twoCallFlow, Method: http.MethodPost, Route: twoCallRoute,
			Body: []byte(fmt.Sprintf(`{"amount":%d}`, amount))}
	default:
		source := "tok_visa"
		if amount%7 == 0 {
			source = "card_declined" // a deterministic 402, stored and replayed like a 201
		}
		return workflow.Request{Scope: scope, Key: key, Flow: chargeflow.FlowName, Method: http.MethodPost, Route: chargesRoute,
			Body: []byte(fmt.Sprintf(`{"amount":%d,"currency":"usd","source":%q}`, amount, source))}
	}
}

// paymentsNamed returns the provider payment ids a stored response names, by call
// phase.
func paymentsNamed(flow string, status int, body []byte) (map[string]string, error) {
	out := map[string]string{}
	if status != http.StatusCreated {
		return out, nil
	}
	switch flow {
	case twoCallFlow:
		var a orderAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			return nil, err
		}
		out[phaseAuthorize], out[phaseCapture] = a.AuthID, a.CaptureID
	case ledgerFlow:
		var a ledgerAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			return nil, err
		}
		out[phaseNotify] = a.NoticeID
	case chargeflow.FlowName:
		var c chargeflow.Charge
		if err := json.Unmarshal(body, &c); err != nil {
			return nil, err
		}
		if c.ProviderPaymentID != nil {
			out[chargeflow.PhaseProvider] = *c.ProviderPaymentID
		}
	}
	return out, nil
}
