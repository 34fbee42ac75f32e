package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
)

// The fused recipe: the best a careful team would hand-write with plain pgx. The claim
// rides in the first phase's transaction, each transaction is one pgx batch (one round
// trip, run by the server as one implicit transaction: all of it commits or none), and
// the statements are plain (no data-modifying CTE, no plpgsql). A fresh charge is three
// round trips: the lookup, the claim with the charge, the finish with the charge's
// update; two of them write. Its key table is the recipe's, under another name.

// fusedLease is how long a claim keeps other attempts off the key.
const fusedLease = 30 * time.Second

// sqlFusedLookup reads a key row; lease_live says whether its lease still runs, by the
// database clock.
const sqlFusedLookup = `SELECT id, request_method, request_path, request_body, recovery_point,
	coalesce(locked_at > now() - $3::bigint * interval '1 millisecond', false), response_code, response_body
FROM fused_keys WHERE scope = $1 AND idempotency_key = $2`

// sqlFusedClaim inserts the key row already at the recovery point of its first phase:
// the row and the charge commit together or not at all, so a committed row at
// "started" never exists. The charge's id is chosen by the client (in the format of the
// charges table's default), so that the row can name it in the same round trip.
const sqlFusedClaim = `INSERT INTO fused_keys (scope, idempotency_key, request_method, request_path, request_body,
	locked_at, recovery_point, charge_id)
VALUES ($1, $2, 'POST', $3, $4, now(), 'charge_created', $5)
ON CONFLICT (scope, idempotency_key) DO NOTHING
RETURNING id, locked_at`

// sqlFusedInsertCharge inserts the charge only if the claim in the same batch inserted
// the key row: if another attempt holds the key, its row names another charge id and
// nothing is inserted.
const sqlFusedInsertCharge = `INSERT INTO charges (id, account_id, idempotency_key, amount, currency, source)
SELECT $1, $2, $3, $4, $5, $6
WHERE EXISTS (SELECT 1 FROM fused_keys WHERE scope = $2 AND idempotency_key = $3 AND charge_id = $1)`

// sqlFusedMarkSucceeded updates the charge only while this attempt's lease holds, and
// locks the key row while it checks, so that no takeover can come between it and the
// finish that follows in the same batch (fencing without a raise).
const sqlFusedMarkSucceeded = `UPDATE charges SET status = 'succeeded', provider_payment_id = $3
WHERE id = $1 AND account_id = $2
	AND EXISTS (SELECT 1 FROM fused_keys WHERE id = $4 AND locked_at = $5 FOR UPDATE)
RETURNING id, amount, currency, source, status, provider_payment_id`

// sqlFusedFinish stores the response and ends the lease, fenced by it.
const sqlFusedFinish = `UPDATE fused_keys SET recovery_point = 'finished', response_code = 201, response_body = $3,
	locked_at = NULL, last_run_at = now()
WHERE id = $1 AND locked_at = $2`

// Answers of the fused recipe to an attempt that finds its key taken.
var (
	errFusedMismatch   = errors.New("fused: key reused for a different request (422)")
	errFusedInProgress = errors.New("fused: request in progress (409)")
	errFusedResume     = errors.New("fused: the key's lease ended before it finished; resuming is not exercised by the bench")
	errFusedLeaseLost  = errors.New("fused: lease lost")
)

// fusedReplay is the answer to a finished key.
type fusedReplay struct {
	status int
	body   []byte
}

// fusedLookup is the lookup: no row (nil, nil), a replay, or the error answering the
// attempt (mismatch, in progress, resume).
func fusedLookup(ctx context.Context, pool *pgxpool.Pool, scope, key string, body []byte) (*fusedReplay, error) {
	var (
		id           int64
		method, path string
		reqBody      []byte
		rp           string
		leaseLive    bool
		code         *int32
		respBody     []byte
	)
	err := pool.QueryRow(ctx, sqlFusedLookup, scope, key, fusedLease.Milliseconds()).
		Scan(&id, &method, &path, &reqBody, &rp, &leaseLive, &code, &respBody)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("look up key: %w", err)
	case method != "POST" || path != chargeRoute || !bytes.Equal(reqBody, body):
		return nil, errFusedMismatch
	case rp == "finished" && code != nil:
		return &fusedReplay{status: int(*code), body: respBody}, nil
	case leaseLive:
		return nil, errFusedInProgress
	}
	return nil, errFusedResume
}

// doFused runs a fresh key through the fused recipe. The bench sends fresh keys only,
// so a key found taken is an error here; the answers are the ones a server would map
// to replay, 409 and 422.
func doFused(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, w *worker) error {
	req, err := chargeflow.ParseRequest(chargeBody)
	if err != nil {
		return err
	}
	scope, key := w.scope(), w.key()
	if rep, err := fusedLookup(ctx, pool, scope, key, chargeBody); err != nil || rep != nil {
		return fusedTaken(rep, err)
	}

	// Phase create_charge, with the claim: one batch, one implicit transaction.
	chargeID := "ch_" + randomHex(16)
	var keyID int64
	var lockedAt time.Time
	b := &pgx.Batch{}
	b.Queue(sqlFusedClaim, scope, key, chargeRoute, chargeBody, chargeID)
	b.Queue(sqlFusedInsertCharge, chargeID, scope, key, req.Amount, req.Currency, req.Source)
	br := pool.SendBatch(ctx, b)
	claimErr := br.QueryRow().Scan(&keyID, &lockedAt)
	tag, chargeErr := br.Exec()
	if err := br.Close(); err != nil {
		return fmt.Errorf("claim and create charge: %w", err)
	}
	switch {
	case errors.Is(claimErr, pgx.ErrNoRows):
		// Another attempt holds the key: answer as the lookup would now.
		rep, err := fusedLookup(ctx, pool, scope, key, chargeBody)
		return fusedTaken(rep, err)
	case claimErr != nil:
		return fmt.Errorf("claim: %w", claimErr)
	case chargeErr != nil:
		return fmt.Errorf("create charge: %w", chargeErr)
	case tag.RowsAffected() != 1:
		return fmt.Errorf("%w: fused: the claim inserted key %s but the charge was not inserted", errInvariant, key)
	}

	// Phase provider_charge, outside any transaction, with a key derived from the row.
	callStart(ctx)
	pay, err := provider.Pay(ctx, "fused:"+strconv.FormatInt(keyID, 10), req)
	callEnd(ctx)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}

	// Phase finalize: the answer is known before the update (every field of the charge
	// is), so the charge's update and the stored response go in one batch.
	want := chargeflow.Charge{ID: chargeID, Amount: req.Amount, Currency: req.Currency, Source: req.Source,
		Status: "succeeded", ProviderPaymentID: &pay}
	body, err := json.Marshal(want)
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue(sqlFusedMarkSucceeded, chargeID, scope, pay, keyID, lockedAt)
	b.Queue(sqlFusedFinish, keyID, lockedAt, body)
	br = pool.SendBatch(ctx, b)
	got, markErr := chargeflow.ScanCharge(br.QueryRow())
	tag, finishErr := br.Exec()
	if err := br.Close(); err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	switch {
	case errors.Is(markErr, pgx.ErrNoRows):
		return errFusedLeaseLost
	case markErr != nil:
		return fmt.Errorf("mark charge succeeded: %w", markErr)
	case finishErr != nil:
		return fmt.Errorf("store the response: %w", finishErr)
	case tag.RowsAffected() != 1:
		return fmt.Errorf("%w: fused: the charge of key %s was updated under its lease but the finish matched no row", errInvariant, key)
	case got.ID != want.ID || got.Status != want.Status || got.ProviderPaymentID == nil || *got.ProviderPaymentID != pay ||
		got.Amount != want.Amount || got.Currency != want.Currency || got.Source != want.Source:
		return fmt.Errorf("%w: fused: stored response %s differs from the charge %+v", errInvariant, body, got)
	}
	return nil
}

// fusedTaken turns the answer to a key found taken into the bench's error.
func fusedTaken(rep *fusedReplay, err error) error {
	if err != nil {
		return err
	}
	if rep != nil {
		return fmt.Errorf("fused: fresh key answered with a replay (%d)", rep.status)
	}
	return errors.New("fused: key vanished between the claim and the lookup")
}

// fusedCheck is what verifyFused found.
type fusedCheck struct {
	Keys, Finished, Charges, Linked, ProviderKeys, ProviderTwice int
}

// verifyFused checks a fused recipe's effects over the whole run (its key table, and
// the prefix of its derived keys): every key row finished with its response, exactly
// one charge per key, succeeded, and exactly one provider request and payment per
// derived key.
func (e *env) verifyFused(ctx context.Context, table, prefix string, providerURLs ...string) (fusedCheck, []string) {
	var c fusedCheck
	var problems []string
	lease := "locked_at" // recipe-fused's lease column; recipe-fused-safe's is locked_until
	if table == "safe_keys" {
		lease = "locked_until"
	}
	err := e.check.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE recovery_point = 'finished' AND response_code = 201 AND `+lease+` IS NULL)
		FROM `+table).Scan(&c.Keys, &c.Finished)
	if err == nil {
		err = e.check.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c.id = k.charge_id AND c.status = 'succeeded'
				AND c.provider_payment_id IS NOT NULL)
			FROM charges c JOIN `+table+` k ON k.scope = c.account_id AND k.idempotency_key = c.idempotency_key`).
			Scan(&c.Charges, &c.Linked)
	}
	if err != nil {
		return c, []string{table + ": verify: " + err.Error()}
	}
	for _, u := range providerURLs {
		st, err := e.providerStats(ctx, u)
		if err != nil {
			return c, []string{table + ": verify: " + err.Error()}
		}
		for k, st := range st.ByKey {
			if strings.HasPrefix(k, prefix) {
				c.ProviderKeys++
				if st.Requests != 1 || st.PaymentID == "" {
					c.ProviderTwice++
				}
			}
		}
	}
	if c.Finished != c.Keys {
		problems = append(problems, fmt.Sprintf("%s: %d of %d key rows finished", table, c.Finished, c.Keys))
	}
	if c.Charges != c.Keys || c.Linked != c.Keys {
		problems = append(problems, fmt.Sprintf("%s: %d charges (%d succeeded and named by their key row) for %d keys", table, c.Charges, c.Linked, c.Keys))
	}
	if c.ProviderKeys != c.Keys || c.ProviderTwice != 0 {
		problems = append(problems, fmt.Sprintf("%s: provider saw %d derived keys for %d keys, %d of them not exactly one request and payment", table, c.ProviderKeys, c.Keys, c.ProviderTwice))
	}
	return c, problems
}

// providerStats reads a fake provider's counters.
func (e *env) providerStats(ctx context.Context, baseURL string) (*chargeflow.ProviderStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/stats", nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st chargeflow.ProviderStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("provider stats: %w", err)
	}
	return &st, nil
}
