package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// mail is a fake mail service for the worker's receipts, in the test process.
type mail struct {
	url string
}

func newMail(t *testing.T) *mail {
	srv := httptest.NewServer(newMailbox().handler())
	t.Cleanup(srv.Close)
	return &mail{url: srv.URL}
}

// sent is how many times the receipt of charge was asked to be sent.
func (m *mail) sent(t *testing.T, charge string) int {
	t.Helper()
	resp, err := http.Get(m.url + "/v1/mail")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st mailStats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st.Sent["receipt:"+charge]
}

func (s *stack) worker(t *testing.T, m *mail) *process {
	t.Helper()
	return run(t, nil, "worker", "-database-url", s.db.URL, "-provider-url", s.provider.url,
		"-sweep-interval", "50ms", "-migrate=false", "-mail-url", m.url)
}

func (s *stack) chargeID(t *testing.T, account, key string) string {
	t.Helper()
	var id string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT id FROM charges WHERE account_id = $1 AND idempotency_key = $2`, account, key).Scan(&id))
	return id
}

// receipts is the number of receipt jobs River holds for charge, in any state.
func (s *stack) receipts(t *testing.T, charge string) int {
	return s.count(t, `SELECT count(*) FROM river_job WHERE kind = 'receipt' AND args->>'charge_id' = $1`, charge)
}

func TestReceiptOutbox(t *testing.T) { testReceiptOutbox(t, direct) }

func testReceiptOutbox(t *testing.T, db backend) {
	t.Parallel()
	s := newStack(t, db)
	m := newMail(t)
	s.worker(t, m)

	keys := []string{"r1", "r2", "r3"}
	for _, k := range keys {
		require.Equal(t, 201, post(t, s.server.url, "acct", k, body).status)
		require.Equal(t, 201, post(t, s.server.url, "acct", k, body).status, "a replay enqueues nothing")
	}
	declined := post(t, s.server.url, "acct", "r-declined", `{"amount":700,"currency":"usd","source":"card_declined"}`)
	require.Equal(t, 402, declined.status)

	for _, k := range keys {
		id := s.chargeID(t, "acct", k)
		eventually(t, "the receipt of "+k+" to be mailed", func() bool { return m.sent(t, id) == 1 })
		require.Equal(t, 1, s.receipts(t, id), "one receipt job per charge")
		eventually(t, "the receipt job of "+k+" to complete", func() bool {
			return s.count(t, `SELECT count(*) FROM river_job WHERE kind = 'receipt' AND args->>'charge_id' = $1 AND state = 'completed'`, id) == 1
		})
	}
	require.Zero(t, s.receipts(t, s.chargeID(t, "acct", "r-declined")), "no receipt for a declined charge")
	require.Equal(t, len(keys), s.count(t, `SELECT count(*) FROM river_job`))
}

// The server is SIGKILLed just before and just after finalize commits: the receipt
// job exists exactly when the charge's success committed, and once the worker's
// sweeper has finished the charge there is exactly one receipt, mailed once.
func TestReceiptOutboxServerKilledAroundFinalize(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"before-commit", "after-commit"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, direct)
			doomed := s.serve(t, []string{"CHARGES_KILL_AT=finalize/" + point})
			_, err := tryPost(doomed.url, "acct", "outbox", body)
			require.Error(t, err, "the server died before answering")
			<-doomed.done
			ws, ok := doomed.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed by SIGKILL: %v", doomed.cmd.ProcessState)
			require.Contains(t, doomed.output(), "CHARGES_KILL_AT=finalize/"+point, "the fault fired")

			id := s.chargeID(t, "acct", "outbox")
			if point == "before-commit" {
				require.Zero(t, s.receipts(t, id), "no receipt for a finalize that did not commit")
				require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE id = $1 AND status = 'pending'`, id))
			} else {
				require.Equal(t, 1, s.receipts(t, id), "the receipt committed with finalize")
				require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE id = $1 AND status = 'succeeded'`, id))
			}

			s.expire(t, "acct", "outbox")
			m := newMail(t)
			s.worker(t, m)
			eventually(t, "the charge finished and its receipt mailed", func() bool {
				return m.sent(t, id) == 1 &&
					s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'outbox' AND status = 'finished'`) == 1
			})
			s.requireCharged(t, "acct", "outbox")
			require.Equal(t, 1, s.receipts(t, id), "exactly one receipt job")
			require.Equal(t, 1, m.sent(t, id), "mailed once")

			replay := post(t, s.server.url, "acct", "outbox", body)
			require.Equal(t, 201, replay.status)
			require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
			require.Equal(t, 1, s.receipts(t, id))
			require.Equal(t, 1, s.count(t, `SELECT count(*) FROM river_job`))
		})
	}
}
