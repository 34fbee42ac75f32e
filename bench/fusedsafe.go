package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
)

// The fused recipe with idemflow's guarantees (recipe-fused-safe): the same three round
// trips as recipe-fused (a lookup, the claim with the charge, the finish with the
// charge's update), but
//
//   - a claim that never waits and lets a loser run nothing: the batch starts with a
//     transaction-scoped advisory lock on a hash of (scope, key), taken without waiting,
//     that raises when it is held (1/0), and inserts the key row with a plain INSERT,
//     which raises on a committed row of the same key; either error aborts the implicit
//     transaction, so the charge's INSERT after it never runs. recipe-fused's ON
//     CONFLICT DO NOTHING waits for an uncommitted insert of the same key and its loser
//     still sends (a guarded) charge INSERT;
//   - a fenced finish: the batch starts by locking the key row without waiting (FOR NO
//     KEY UPDATE NOWAIT) at the lock version the claim set, raising when the version
//     moved or the row is locked, before the charge's update and the key row's finish;
//   - the sweeper's index on the key table: unfinished keys by due time, a partial index
//     whose predicate the finish changes, so that the finish is not a HOT update (as
//     idemflow's is not). Like recipe-fused it has no retention or dead-letter index and
//     writes no history.
//
// Its key table is safe_keys; its effects are checked at the end of the run like
// recipe-fused's.

const safeKeysDDL = `
CREATE TABLE IF NOT EXISTS safe_keys (
	id              bigserial   PRIMARY KEY,
	scope           text        NOT NULL,
	idempotency_key text        NOT NULL,
	request_method  text        NOT NULL,
	request_path    text        NOT NULL,
	request_body    bytea       NOT NULL,
	lock_version    bigint      NOT NULL DEFAULT 1,
	locked_until    timestamptz,
	next_attempt_at timestamptz NOT NULL DEFAULT now(),
	recovery_point  text        NOT NULL DEFAULT 'started',
	charge_id       text,
	response_code   int,
	response_body   bytea,
	created_at      timestamptz NOT NULL DEFAULT now(),
	last_run_at     timestamptz NOT NULL DEFAULT now(),
	UNIQUE (scope, idempotency_key)
);
CREATE INDEX IF NOT EXISTS safe_keys_due_idx ON safe_keys (next_attempt_at) WHERE recovery_point <> 'finished'`

// sqlSafeLookup reads a key row, like sqlFusedLookup.
const sqlSafeLookup = `SELECT id, request_method, request_path, request_body, recovery_point,
	coalesce(locked_until > now(), false), response_code, response_body
FROM safe_keys WHERE scope = $1 AND idempotency_key = $2`

// sqlSafeClaimLock takes the key's claim lock without waiting, or raises (division by
// zero) when another transaction holds it.
const sqlSafeClaimLock = `SELECT 1 / pg_try_advisory_xact_lock($1::bigint)::int`

// sqlSafeClaim inserts the key row at its first phase's recovery point, leased for $6
// ms; a committed row of the key makes it raise (unique violation).
const sqlSafeClaim = `INSERT INTO safe_keys (scope, idempotency_key, request_method, request_path, request_body,
	locked_until, next_attempt_at, recovery_point, charge_id)
VALUES ($1, $2, 'POST', $3, $4, now() + $6::bigint * interval '1 millisecond',
	now() + $6::bigint * interval '1 millisecond', 'charge_created', $5)
RETURNING id, lock_version`

// sqlSafeInsertCharge is the phase's own statement: it runs only if the claim won.
const sqlSafeInsertCharge = `INSERT INTO charges (id, account_id, idempotency_key, amount, currency, source)
VALUES ($1, $2, $3, $4, $5, $6)`

// sqlSafeFence locks the key row without waiting at the lock version the claim set;
// raises (division by zero) when the version moved, and 55P03 when the row is locked.
const sqlSafeFence = `SELECT 1 / count(*)::int FROM (
	SELECT 1 FROM safe_keys WHERE id = $1 AND lock_version = $2 FOR NO KEY UPDATE NOWAIT) f`

// sqlSafeMarkSucceeded is the phase's own statement, under the fence.
const sqlSafeMarkSucceeded = `UPDATE charges SET status = 'succeeded', provider_payment_id = $3
WHERE id = $1 AND account_id = $2
RETURNING id, amount, currency, source, status, provider_payment_id`

// sqlSafeFinish stores the response and ends the lease: a plain update of the row the
// fence locked.
const sqlSafeFinish = `UPDATE safe_keys SET recovery_point = 'finished', response_code = 201, response_body = $2,
	locked_until = NULL, last_run_at = now()
WHERE id = $1`

// safeLockID is the claim lock's id: a 64-bit hash of (scope, key).
func safeLockID(scope, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// safeLost reports whether err is a claim or fence that lost: the lock was held
// (division by zero from the lock or the fence's count, or 55P03), or the key row exists.
func safeLost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "22012" || pe.Code == "55P03" || pe.Code == "23505")
}

// doFusedSafe runs a fresh key through the safe fused recipe.
func doFusedSafe(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, w *worker) error {
	return fusedSafeKey(ctx, pool, provider, w.scope(), w.key())
}

// fusedSafeKey runs key through the safe fused recipe.
func fusedSafeKey(ctx context.Context, pool *pgxpool.Pool, provider *chargeflow.ProviderClient, scope, key string) error {
	req, err := chargeflow.ParseRequest(chargeBody)
	if err != nil {
		return err
	}
	if rep, err := safeLookup(ctx, pool, scope, key); err != nil || rep != nil {
		return fusedTaken(rep, err)
	}

	// Phase create_charge, after the claim: one batch, one implicit transaction.
	chargeID := "ch_" + randomHex(16)
	var keyID, version int64
	b := &pgx.Batch{}
	b.Queue(sqlSafeClaimLock, safeLockID(scope, key))
	b.Queue(sqlSafeClaim, scope, key, chargeRoute, chargeBody, chargeID, fusedLease.Milliseconds())
	b.Queue(sqlSafeInsertCharge, chargeID, scope, key, req.Amount, req.Currency, req.Source)
	br := pool.SendBatch(ctx, b)
	_, lockErr := br.Exec()
	claimErr := br.QueryRow().Scan(&keyID, &version)
	_, chargeErr := br.Exec()
	closeErr := br.Close()
	switch err := errors.Join(lockErr, claimErr, chargeErr, closeErr); {
	case safeLost(lockErr) || safeLost(claimErr):
		// Another attempt holds the key or has it: nothing of the phase ran.
		rep, err := safeLookup(ctx, pool, scope, key)
		if err == nil && rep == nil {
			return errFusedInProgress
		}
		return fusedTaken(rep, err)
	case err != nil:
		return fmt.Errorf("claim and create charge: %w", err)
	}

	// Phase provider_charge, outside any transaction, with a key derived from the row.
	callStart(ctx)
	pay, err := provider.Pay(ctx, "safe:"+strconv.FormatInt(keyID, 10), req)
	callEnd(ctx)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return safeFinalize(ctx, pool, keyID, version, chargeID, scope, pay, req)
}

// safeFinalize is the finalize phase: the fence, the charge's update and the stored
// response in one batch (the answer is known before the update, as in recipe-fused).
func safeFinalize(ctx context.Context, pool *pgxpool.Pool, keyID, version int64, chargeID, scope, pay string, req chargeflow.Request) error {
	want := chargeflow.Charge{ID: chargeID, Amount: req.Amount, Currency: req.Currency, Source: req.Source,
		Status: "succeeded", ProviderPaymentID: &pay}
	body, err := json.Marshal(want)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(sqlSafeFence, keyID, version)
	b.Queue(sqlSafeMarkSucceeded, chargeID, scope, pay)
	b.Queue(sqlSafeFinish, keyID, body)
	br := pool.SendBatch(ctx, b)
	_, fenceErr := br.Exec()
	got, markErr := chargeflow.ScanCharge(br.QueryRow())
	tag, finishErr := br.Exec()
	closeErr := br.Close()
	switch err := errors.Join(fenceErr, markErr, finishErr, closeErr); {
	case safeLost(fenceErr):
		return errFusedLeaseLost
	case err != nil:
		return fmt.Errorf("finalize: %w", err)
	case tag.RowsAffected() != 1:
		return fmt.Errorf("%w: safe: the fence held key row %d but the finish matched no row", errInvariant, keyID)
	case got.ID != want.ID || got.Status != want.Status || got.ProviderPaymentID == nil || *got.ProviderPaymentID != pay ||
		got.Amount != want.Amount || got.Currency != want.Currency || got.Source != want.Source:
		return fmt.Errorf("%w: safe: stored response %s differs from the charge %+v", errInvariant, body, got)
	}
	return nil
}

// safeLookup is fusedLookup on safe_keys.
func safeLookup(ctx context.Context, pool *pgxpool.Pool, scope, key string) (*fusedReplay, error) {
	var (
		id           int64
		method, path string
		reqBody      []byte
		rp           string
		leaseLive    bool
		code         *int32
		respBody     []byte
	)
	err := pool.QueryRow(ctx, sqlSafeLookup, scope, key).
		Scan(&id, &method, &path, &reqBody, &rp, &leaseLive, &code, &respBody)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("look up key: %w", err)
	case method != "POST" || path != chargeRoute || string(reqBody) != string(chargeBody):
		return nil, errFusedMismatch
	case rp == "finished" && code != nil:
		return &fusedReplay{status: int(*code), body: respBody}, nil
	case leaseLive:
		return nil, errFusedInProgress
	}
	return nil, errFusedResume
}
