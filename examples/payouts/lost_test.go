package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
)

// TestAnyPayoutIDIsPaidOnce: payout ids that Parse accepts but that are not valid
// idempotency keys (not ASCII, control characters, spaces, the hashed form's shape) are
// each paid exactly once, and a duplicate under another message id replays.
func TestAnyPayoutIDIsPaidOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	c := r.consume(nil)
	var ps []payout.Requested
	for i, id := range []string{"po_é", "po\u0001x", "po\u009b31m", "po\x7f", "po 1", "~1~x", "po_" + strings.Repeat("ü", 98)} {
		p := payout.Requested{PayoutID: id, Account: "acct_1", Amount: int64(100 + i), Currency: "eur"}
		ps = append(ps, p)
		require.False(t, r.publish(fmt.Sprintf("msg-%d", i), p))
		require.False(t, r.publish(fmt.Sprintf("msg-%d-again", i), p))
	}
	r.settled(ps, true)
	r.requireExactlyOnce(ps)
	require.Zero(t, c.count("action=terminate"), "no payout was given up on")
	require.Equal(t, len(ps), c.count("action=ack", "replayed=true"), "each duplicate replayed")
	n, err := r.count(`SELECT count(*) FROM payout_dead_letters`)
	require.NoError(t, err)
	require.Zero(t, n)
	for _, l := range c.output() {
		require.NotContains(t, l, "\u009b", "no control character reaches the consumer's output")
		require.NotContains(t, l, "\x01")
	}
}

// TestSamePayoutIDFromTwoAccounts: two accounts that use the same payout id have two
// payouts, each paid once.
func TestSamePayoutIDFromTwoAccounts(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	c := r.consume(nil)
	ps := []payout.Requested{
		{PayoutID: "po_1", Account: "acct_a", Amount: 100, Currency: "eur"},
		{PayoutID: "po_1", Account: "acct_b", Amount: 250, Currency: "eur"},
		{PayoutID: "po_1", Account: "café", Amount: 300, Currency: "eur"},
		{PayoutID: "po_1", Account: "acct\u0085x", Amount: 400, Currency: "eur"},
		{PayoutID: "po_1", Account: "~1~acct_a", Amount: 500, Currency: "eur"},
	}
	for i, p := range ps {
		require.False(t, r.publish(fmt.Sprintf("msg-%d", i), p))
	}
	r.settled(ps, true)
	r.requireExactlyOnce(ps)
	require.Zero(t, c.count("action=terminate"), "no payout was given up on")
}

// TestGivenUpMessagesAreDeadLettered: a message the consumer gives up on (it does not
// parse; its payout id was used for another amount) is recorded in
// payout_dead_letters before it is terminated, `payouts dead-letters list` shows it,
// and `payouts dead-letters replay` publishes it again to the stream.
func TestGivenUpMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	c := r.consume(nil)
	good := payoutN(0)
	require.False(t, r.publish("msg-good", good))
	r.settled([]payout.Requested{good}, true)
	wrong := good
	wrong.Amount = 999
	require.False(t, r.publish("msg-wrong", wrong))
	require.False(t, r.publishRaw("msg-bad\x1b", []byte(`{"payout_id":"po_x","account":"a","amount":0,"currency":"eur"}`)))
	r.eventually("two dead letters", func() (bool, error) {
		n, err := r.count(`SELECT count(*) FROM payout_dead_letters`)
		return n == 2, err
	})
	r.settled([]payout.Requested{good}, true) // both terminated: nothing pending
	require.Equal(t, 2, c.count("action=terminate", "dead_letter="+r.stream+"/"))

	list := r.cli(t, "dead-letters", "list", "-database-url", r.db.URL)
	require.Contains(t, list, "2 dead letters")
	require.Contains(t, list, `msg_id="msg-wrong"`)
	require.Contains(t, list, "reused for a different request")
	require.Contains(t, list, `msg_id="msg-bad\x1b"`, "quoted, never raw")
	require.Contains(t, list, "amount must be a positive integer")
	require.NotContains(t, list, "\x1b")

	var id int64
	require.NoError(t, r.db.Pool.QueryRow(context.Background(),
		`SELECT id FROM payout_dead_letters WHERE msg_id = $1`, []byte("msg-bad\x1b")).Scan(&id))
	out := r.cli(t, "dead-letters", "replay", "-database-url", r.db.URL, "-nats-url", natsURL(), "-id", fmt.Sprint(id))
	require.Contains(t, out, fmt.Sprintf("replayed id=%d as msg_id=%s", id, payout.ReplayMsgID(id, 1)))
	r.eventually("the replay delivered and given up on again", func() (bool, error) {
		n, err := r.count(`SELECT count(*) FROM payout_dead_letters WHERE msg_id = $1`, []byte(payout.ReplayMsgID(id, 1)))
		return n == 1, err
	})
	replays, err := r.count(`SELECT replays FROM payout_dead_letters WHERE id = $1`, id)
	require.NoError(t, err)
	require.Equal(t, 1, replays)
	r.requireExactlyOnce([]payout.Requested{good})
}

// cli runs the payouts command and returns its output; it must succeed.
func (r *rig) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	require.NoError(t, err, "payouts %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// TestLastDeliveryIsDeadLettered: with -max-deliver 1 a delivery that fails in a way
// worth retrying (the bank answers 503) has no redelivery to come: the consumer records
// it as a dead letter before terminating it. The sweeper finishes the payout, and the
// operator's replay of the dead letter is answered from the stored result, once.
func TestLastDeliveryIsDeadLettered(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2) // the second bank request fails
	c := r.consume(nil, "-max-deliver", "1", "-workers", "1")
	ps := ids(2)
	require.False(t, r.publish("msg-0", ps[0]))
	require.False(t, r.publish("msg-1", ps[1]))
	r.settled(ps, false)
	r.requireExactlyOnce(ps)
	var id int64
	var reason string
	require.NoError(t, r.db.Pool.QueryRow(context.Background(),
		`SELECT id, reason FROM payout_dead_letters WHERE msg_id = $1`, []byte("msg-1")).Scan(&id, &reason))
	require.Contains(t, reason, "no delivery left after 1")
	require.Equal(t, 1, c.count("payout=po_001", "action=terminate", "dead_letter="))

	r.cli(t, "dead-letters", "replay", "-database-url", r.db.URL, "-nats-url", natsURL(), "-all")
	r.eventually("the replay answered from the stored result", func() (bool, error) {
		return c.count("payout=po_001", "action=ack", "replayed=true") == 1, nil
	})
	r.requireExactlyOnce(ps)
	out := r.cli(t, "dead-letters", "list", "-database-url", r.db.URL)
	require.Contains(t, out, fmt.Sprintf("id=%d ", id))
	require.Contains(t, out, "replays=1")
}
