package idemflowtest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
)

// The kit's own test flow: debit (tx) writes a ledger row, pay (call) asks the remote
// under the derived key, record (tx) settles the row and answers.
const ledgerSchema = `CREATE TABLE ledger (
	id     bigserial PRIMARY KEY,
	ref    text   NOT NULL,
	amount bigint NOT NULL,
	paid   text
)` // no unique constraint: a duplicated effect shows up as a second row

// flowOpts break the flow on purpose.
type flowOpts struct {
	debitOnPool bool // debit writes on the pool, outside its transaction
	freshKey    bool // pay sends a new random key each attempt instead of the derived key
}

var (
	ledgerID = phases.NewSlot[int64]("ledger_id")
	payID    = phases.NewSlot[string]("pay_id")
)

func ledgerFlow(db *idemflowtest.DB, remote *idemflowtest.Remote, o flowOpts) phases.Flow {
	return phases.Flow{Name: "ledger", Phases: []phases.Phase{
		phases.Tx("debit", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			var on phases.DBTX = tx
			if o.debitOnPool {
				on = db.Pool
			}
			var id int64
			if err := on.QueryRow(ctx, `INSERT INTO ledger (ref, amount) VALUES ($1, 100) RETURNING id`, run.Key()).Scan(&id); err != nil {
				return nil, err
			}
			return nil, ledgerID.Set(run, id)
		}),
		phases.Call("pay", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			key := run.DerivedKey()
			if o.freshKey {
				key = rand.Text()
			}
			id, err := pay(ctx, remote.URL+"/pay", key, run.Key())
			if err != nil {
				return nil, err
			}
			return nil, payID.Set(run, id)
		}),
		phases.Tx("record", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := ledgerID.Get(run)
			if err != nil {
				return nil, err
			}
			paid, err := payID.Get(run)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, `UPDATE ledger SET paid = $2 WHERE id = $1`, id, paid); err != nil {
				return nil, err
			}
			resp, err := phases.JSON(http.StatusCreated, map[string]any{"ledger_id": id, "paid": paid})
			if err != nil {
				return nil, err
			}
			resp.Header.Set("Location", fmt.Sprintf("/ledger/%d", id))
			return resp, nil
		}),
	}}
}

// pay asks the remote for one payment under key, for the client's request ref.
func pay(ctx context.Context, url, key, ref string) (string, error) {
	body, _ := json.Marshal(map[string]string{"ref": ref})
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
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("remote answered %d: %s", resp.StatusCode, b)
	}
	var out struct{ ID string }
	if err := json.Unmarshal(b, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

// checkLedger is the flow's promise: one ledger row per key, paid by the one remote
// effect made for it (under the pay phase's derived key, unless o.freshKey).
func checkLedger(remote *idemflowtest.Remote, o flowOpts) func(t testing.TB, c *idemflowtest.Case) {
	return func(t testing.TB, c *idemflowtest.Case) {
		var rows int
		var paid string
		require.NoError(t, c.DB.Pool.QueryRow(context.Background(),
			`SELECT count(*), coalesce(max(paid), '') FROM ledger WHERE ref = $1`, c.Request.Key).Scan(&rows, &paid))
		require.Equal(t, 1, rows, "ledger rows for the key")
		var made []string
		for _, e := range remote.Effects() {
			var body struct{ Ref string }
			if json.Unmarshal(e.Body, &body) == nil && body.Ref == c.Request.Key {
				made = append(made, e.ID)
			}
		}
		require.Len(t, made, 1, "remote effects for the key")
		require.Equal(t, made[0], paid)
		if !o.freshKey {
			e, ok := remote.Effect(c.DerivedKey("pay"))
			require.True(t, ok, "the effect was made under the derived key")
			require.Equal(t, e.ID, paid)
		}
		require.JSONEq(t, fmt.Sprintf(`{"ledger_id":%d,"paid":%q}`, mustLedgerID(t, c), paid), string(c.Answer.Body))
	}
}

func mustLedgerID(t testing.TB, c *idemflowtest.Case) int64 {
	var id int64
	require.NoError(t, c.DB.Pool.QueryRow(context.Background(), `SELECT id FROM ledger WHERE ref = $1`, c.Request.Key).Scan(&id))
	return id
}
