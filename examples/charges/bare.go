package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
)

// bareControlSchema is the table of serve -bare-control's endpoint.
const bareControlSchema = `CREATE TABLE IF NOT EXISTS bare_control (
	id         bigserial   PRIMARY KEY,
	account_id text        NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`

// bareControlInsert is the endpoint's only statement.
const bareControlInsert = `INSERT INTO bare_control (account_id) VALUES ($1) RETURNING id`

// withBareControl creates the bare_control table (serialised like the migrations, so
// that several servers may start at once) and returns api with POST /v1/bare added:
// one autocommit INSERT through the same pool and HTTP server as the charges, with no
// idempotency at all. A load test sends it beside the charges to tell the cost of
// idemflow from the load of the machine; the table is never cleaned up.
func withBareControl(ctx context.Context, e *env, api http.Handler) (http.Handler, error) {
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('charges.bare:' || current_schema(), 0))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, bareControlSchema)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create bare_control: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc("POST /v1/bare", func(w http.ResponseWriter, r *http.Request) {
		account, ok := readAccount(w, r)
		if !ok {
			return
		}
		var id int64
		if err := e.pool.QueryRow(r.Context(), bareControlInsert, account).Scan(&id); err != nil {
			e.readFailed(w, r, "bare insert", err)
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int64{"id": id})
	})
	return mux, nil
}
