package payout

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bare does a payout's work without idemflow, for the benchmark: the same two
// transactions and bank call as Flow, with the payout id as the bank's idempotency
// key, but no key row, no recovery point and no replay. It is not safe to retry: a
// redelivery records and settles the payout again.
func Bare(ctx context.Context, pool *pgxpool.Pool, bank *BankClient, body []byte) (Paid, error) {
	req, err := Parse(body)
	if err != nil {
		return Paid{}, err
	}
	var id int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err = record(ctx, tx, req)
		return err
	})
	if err != nil {
		return Paid{}, err
	}
	tid, err := bank.Transfer(ctx, "bare:"+req.PayoutID, req)
	if err != nil {
		return Paid{}, fmt.Errorf("bank: %w", err)
	}
	var paid Paid
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		paid, err = settle(ctx, tx, id, tid)
		return err
	})
	return paid, err
}
