package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

// accountsSetup gives the test's accounts their money: enough for every case of a crash
// matrix, whose cases share the account and each withdraw.
const accountsSetup = `INSERT INTO accounts (id, balance) VALUES ('acct', 100000)`

// refuseClosed makes the fake bank refuse transfers to the IBAN "closed".
func refuseClosed(_ string, body []byte) bool {
	var req withdrawalRequest
	return json.Unmarshal(body, &req) == nil && req.IBAN == "closed"
}

func newBank(url string) *bank { return &bank{url: url, http: http.DefaultClient} }

// moves returns the ledger's entries of the withdrawal of scope and key, and the
// withdrawals of that key.
func moves(t testing.TB, db *idemflowtest.DB, scope, key string) (entries []string, withdrawals int, status string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(status), '') FROM withdrawals
		WHERE account_id = $1 AND idem_key = $2`, scope, key).Scan(&withdrawals, &status))
	rows, err := db.Pool.Query(ctx, `SELECT l.what || ' ' || l.amount FROM ledger l JOIN withdrawals w ON w.id = l.withdrawal_id
		WHERE w.account_id = $1 AND w.idem_key = $2 ORDER BY l.what`, scope, key)
	require.NoError(t, err)
	entries, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return entries, withdrawals, status
}

// TestWithdrawalSurvivesCrashes kills the flow at every boundary, sent and refused,
// and recovers each key by a retry and by sweepers: one withdrawal, the account debited
// once (and given back once when the bank refused), one transfer under the derived key.
func TestWithdrawalSurvivesCrashes(t *testing.T) {
	for _, tc := range []struct {
		name, iban, status string
		code               int
		ledger             []string
	}{
		{"Sent", "DE89370400440532013000", "sent", http.StatusCreated, []string{"debit -500"}},
		{"Refused", "closed", "refused", http.StatusPaymentRequired, []string{"debit -500", "refund 500"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := idemflowtest.NewDB(t, Schema, accountsSetup)
			remote := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{Decline: refuseClosed})
			idemflowtest.CrashMatrix(t, idemflowtest.Crash{
				DB:   db,
				Flow: withdrawalFlow(newBank(remote.URL)),
				Request: workflow.Request{Scope: "acct", Key: "wd", Route: "/v1/withdrawals",
					Body: []byte(`{"amount":500,"iban":"` + tc.iban + `"}`)},
				Check: func(t testing.TB, c *idemflowtest.Case) {
					entries, withdrawals, status := moves(t, db, c.Request.Scope, c.Request.Key)
					require.Equal(t, 1, withdrawals, "withdrawals")
					require.Equal(t, tc.status, status)
					require.Equal(t, tc.ledger, entries, "the ledger's entries")
					require.Equal(t, tc.code, c.Answer.Status)
					transfer, ok := remote.Effect(c.DerivedKey(phaseBank))
					require.True(t, ok, "the bank was asked under the derived key")
					require.Equal(t, tc.code == http.StatusPaymentRequired, transfer.Declined)
					if !transfer.Declined {
						require.Contains(t, string(c.Answer.Body), `"bank_ref":"`+transfer.ID+`"`)
					}
				},
			})
		})
	}
}

// TestCallRunsAtLeastOnce is the call-phase contract: a crash after the bank answered
// and before settle committed makes the recovery call the bank again, with the same
// derived key. The bank saw two requests and made one transfer.
func TestCallRunsAtLeastOnce(t *testing.T) {
	db := idemflowtest.NewDB(t, Schema, accountsSetup)
	remote := idemflowtest.NewRemote(t, nil)
	idemflowtest.CrashMatrix(t, idemflowtest.Crash{
		DB:         db,
		Flow:       withdrawalFlow(newBank(remote.URL)),
		Request:    workflow.Request{Scope: "acct", Key: "twice", Body: []byte(`{"amount":500,"iban":"DE89370400440532013000"}`)},
		Boundaries: []string{phaseBank + "/after-call"},
		Check: func(t testing.TB, c *idemflowtest.Case) {
			derived := c.DerivedKey(phaseBank)
			require.Equal(t, 2, remote.Requests(derived), "the bank's requests under %s", derived)
			_, ok := remote.Effect(derived)
			require.True(t, ok)
			entries, withdrawals, _ := moves(t, db, c.Request.Scope, c.Request.Key)
			require.Equal(t, 1, withdrawals)
			require.Equal(t, []string{"debit -500"}, entries)
		},
	})
	require.Equal(t, len(remote.Effects()), remote.Made(), "one transfer per derived key")
}

// setup is an engine with the flow, on a database of its own with a funded account.
func setup(t *testing.T) (*workflow.Engine, *idemflowtest.DB, *idemflowtest.Remote) {
	t.Helper()
	return setupFlow(t, withdrawalFlow)
}

// setupFlow is setup with the flow flow builds.
func setupFlow(t *testing.T, flow func(*bank) phases.Flow) (*workflow.Engine, *idemflowtest.DB, *idemflowtest.Remote) {
	t.Helper()
	db := idemflowtest.NewDB(t, Schema, `INSERT INTO accounts (id, balance) VALUES ('acct', 1000)`)
	remote := idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{Decline: refuseClosed})
	e, err := workflow.New(db.Pool, &workflow.Config{AdmitWait: -1})
	require.NoError(t, err)
	require.NoError(t, e.Register(flow(newBank(remote.URL))))
	return e, db, remote
}

func balance(t *testing.T, db *idemflowtest.DB) int64 {
	t.Helper()
	var b int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT balance FROM accounts WHERE id = 'acct'`).Scan(&b))
	return b
}

func withdrawal(key, body string) workflow.Request {
	return workflow.Request{Scope: "acct", Key: key, Flow: flowName, Method: "POST", Route: "/v1/withdrawals", Body: []byte(body)}
}

// TestRefusalIsCompensated: the bank refuses after debit committed; settle gives the
// money back in its transaction and answers 402, stored and replayed; a retry neither
// debits again nor asks the bank again.
func TestRefusalIsCompensated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, db, remote := setup(t)
	req := withdrawal("refused-1", `{"amount":300,"iban":"closed"}`)

	res, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, res.Response.Status)
	require.Contains(t, string(res.Response.Body), `"title":"transfer refused"`)
	require.Equal(t, int64(1000), balance(t, db), "the debit was given back")
	entries, _, status := moves(t, db, "acct", "refused-1")
	require.Equal(t, "refused", status)
	require.Equal(t, []string{"debit -300", "refund 300"}, entries)

	again, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.Response.Body, again.Response.Body)
	require.Equal(t, int64(1000), balance(t, db))
	key := idemflowtest.RequireFinished(t, db.Pool, "acct", "refused-1")
	require.Equal(t, 1, remote.Requests(key.ID+":"+phaseBank), "the bank was asked once")
}

// TestInsufficientFundsWritesNothing: a final answer from the first tx phase rolls its
// writes back and is stored: no withdrawal, no call.
func TestInsufficientFundsWritesNothing(t *testing.T) {
	t.Parallel()
	e, db, remote := setup(t)
	res, err := e.Do(context.Background(), withdrawal("too-much", `{"amount":5000,"iban":"DE89370400440532013000"}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, res.Response.Status)
	require.Equal(t, int64(1000), balance(t, db))
	_, withdrawals, _ := moves(t, db, "acct", "too-much")
	require.Zero(t, withdrawals)
	requests, _ := remote.Total()
	require.Zero(t, requests)
}

// TestCancelLeavesTheDebit is what a cancel does to a key stuck after debit (the bank
// is down), which it refuses without force since the transfer may have been made.
// Without a compensation, a forced cancel finishes the key with the operator's answer
// and leaves the service's committed rows (the debit, the pending withdrawal) as they
// are: undoing them is then the operator's, in a transaction of their own. With the
// flow's compensation (cancelWithdrawal), the cancel says what it will run and gives
// the money back in its own transaction: nothing is left half-done, and nothing can be
// undone twice.
func TestCancelLeavesTheDebit(t *testing.T) {
	t.Parallel()
	answer := workflow.CancelOptions{Status: http.StatusConflict, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"error":"cancelled by support"}`)}
	stuck := func(t *testing.T, e *workflow.Engine, db *idemflowtest.DB, remote *idemflowtest.Remote) {
		remote.FailNext(1)
		_, err := e.Do(context.Background(), withdrawal("stuck", `{"amount":200,"iban":"DE89370400440532013000"}`))
		require.ErrorIs(t, err, workflow.ErrTransient)
		idemflowtest.RequireInProgressAt(t, db.Pool, "acct", "stuck", phaseDebit)
		require.ErrorIs(t, e.CancelKey(context.Background(), "acct", "stuck", answer), workflow.ErrCallMayHaveRun)
	}
	forced := answer
	forced.Force = true

	t.Run("WithoutCompensation", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e, db, remote := setupFlow(t, func(b *bank) phases.Flow {
			f := withdrawalFlow(b)
			f.Compensation = phases.Compensation{}
			return f
		})
		stuck(t, e, db, remote)
		p, err := e.PreviewCancel(ctx, "acct", "stuck")
		require.NoError(t, err)
		require.Contains(t, p.Effect(false), "no compensation")
		require.NoError(t, e.CancelKey(ctx, "acct", "stuck", forced))
		idemflowtest.RequireFinished(t, db.Pool, "acct", "stuck")
		require.Equal(t, int64(800), balance(t, db), "the cancel left the debit")
		entries, _, status := moves(t, db, "acct", "stuck")
		require.Equal(t, "pending", status)
		require.Equal(t, []string{"debit -200"}, entries)

		// The operator's undo, in a transaction of their own, once the bank has said
		// that no transfer was made under the key's derived key.
		var id string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM withdrawals WHERE account_id = 'acct' AND idem_key = 'stuck'`).Scan(&id))
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return undoWithdrawal(ctx, tx, id, "cancelled by support")
		}))
		require.Equal(t, int64(1000), balance(t, db))
		err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return undoWithdrawal(ctx, tx, id, "twice") })
		require.True(t, errors.Is(err, pgx.ErrNoRows), "a second undo is refused: %v", err)
		require.Equal(t, int64(1000), balance(t, db))
	})

	t.Run("WithCompensation", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e, db, remote := setup(t)
		stuck(t, e, db, remote)
		p, err := e.PreviewCancel(ctx, "acct", "stuck")
		require.NoError(t, err)
		require.Equal(t, `will run compensation "undo_withdrawal" of flow "withdraw" from recovery point "debit", in the cancel's transaction`, p.Effect(false))
		require.NoError(t, e.CancelKey(ctx, "acct", "stuck", forced))
		idemflowtest.RequireFinished(t, db.Pool, "acct", "stuck")
		require.Equal(t, int64(1000), balance(t, db), "the compensation gave the money back")
		entries, withdrawals, status := moves(t, db, "acct", "stuck")
		require.Equal(t, 1, withdrawals)
		require.Equal(t, "refused", status)
		require.Equal(t, []string{"debit -200", "refund 200"}, entries)
		res, err := e.Do(ctx, withdrawal("stuck", `{"amount":200,"iban":"DE89370400440532013000"}`))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, http.StatusConflict, res.Response.Status)
		require.ErrorIs(t, e.CancelKey(ctx, "acct", "stuck", forced), workflow.ErrWrongStatus)
		require.Equal(t, int64(1000), balance(t, db), "undone once")
	})
}
