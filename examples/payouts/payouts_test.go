package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
)

func ids(n int) []payout.Requested {
	out := make([]payout.Requested, n)
	for i := range out {
		out[i] = payoutN(i)
	}
	return out
}

func TestDuplicatesAreOnePayout(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	c := r.consume(nil)
	const n = 6
	for i := range n {
		require.False(t, r.publish(fmt.Sprintf("msg-%d", i), payoutN(i)))
		// The same message published again: the broker drops it (its duplicate window).
		require.True(t, r.publish(fmt.Sprintf("msg-%d", i), payoutN(i)), "the broker saw the Nats-Msg-Id duplicate")
		// The same payout under another message id: delivered, and replayed.
		require.False(t, r.publish(fmt.Sprintf("msg-%d-again", i), payoutN(i)))
	}
	r.settled(ids(n), true)
	// The same payout id with another amount, once the payout is paid: a mismatch,
	// terminated.
	wrong := payoutN(0)
	wrong.Amount = 999_999
	require.False(t, r.publish("msg-0-wrong", wrong))
	r.settled(ids(n), true)
	r.requireExactlyOnce(ids(n))
	r.eventually("every delivery answered", func() (bool, error) {
		return c.count("delivery payout=") >= 2*n+1, nil
	})
	require.Equal(t, n, c.count("action=ack", "replayed=true"), "each business-key duplicate was replayed")
	require.Equal(t, 1, c.count("payout=po_000", "action=terminate", "reused for a different request"), "the mismatch was terminated")
	amount, err := r.count(`SELECT amount FROM ledger WHERE payout_id = 'po_000'`)
	require.NoError(t, err)
	require.Equal(t, int(payoutN(0).Amount), amount)
}

func TestWithheldAcksAreRedeliveredAndReplayed(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	const n, withheld = 5, 3
	c := r.consume([]string{fmt.Sprintf("%s=%d", envWithholdAcks, withheld)}, "-ack-wait", "1s", "-workers", "1")
	for i := range n {
		r.publish(fmt.Sprintf("msg-%d", i), payoutN(i))
	}
	r.settled(ids(n), true)
	r.requireExactlyOnce(ids(n))
	require.Equal(t, withheld, c.count("withheld ack"), "the fault fired")
	// Each withheld ack came back as a later delivery of the same payout that replayed.
	// The fault withholds the first answers in the order the consumer gives them, and
	// on a slow machine a redelivery (ack wait 1 s) can be among them: then one payout
	// has two withheld deliveries and one replay answers both, so what is checked is
	// each withheld delivery against a later replay, not a count of replays.
	var held []string // "payout delivered" of each withheld ack
	replays := map[string]int{}
	for _, l := range c.output() {
		var id string
		var n int
		switch {
		case strings.HasPrefix(l, "withheld ack "):
			_, err := fmt.Sscanf(l, "withheld ack payout=%s delivered=%d", &id, &n)
			require.NoError(t, err, l)
			held = append(held, fmt.Sprintf("%s %d", id, n))
		case strings.HasPrefix(l, "delivery ") && strings.Contains(l, "action=ack") && strings.Contains(l, "replayed=true"):
			_, err := fmt.Sscanf(l, "delivery payout=%s delivered=%d", &id, &n)
			require.NoError(t, err, l)
			require.Greater(t, n, 1, "only a redelivery replays: %s", l)
			replays[id] = max(replays[id], n)
		}
	}
	require.Len(t, held, withheld)
	for _, h := range held {
		var id string
		var n int
		_, err := fmt.Sscanf(h, "%s %d", &id, &n)
		require.NoError(t, err)
		require.Greater(t, replays[id], n, "withheld ack of payout %s delivery %d came back as a later delivery that replayed", id, n)
	}
}

func TestCompetingConsumersAndAFailingBank(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4) // every 4th bank request fails
	a := r.consume(nil, "-workers", "2")
	b := r.consume(nil, "-workers", "2")
	const n = 30
	for i := range n {
		r.publish(fmt.Sprintf("msg-%d", i), payoutN(i))
		if i%3 == 0 {
			r.publish(fmt.Sprintf("msg-%d-again", i), payoutN(i))
		}
	}
	r.settled(ids(n), true)
	r.requireExactlyOnce(ids(n))
	require.Positive(t, a.count("delivery payout="), "consumer a handled deliveries")
	require.Positive(t, b.count("delivery payout="), "consumer b handled deliveries")
	require.Positive(t, r.bank.Stats().Failed, "the bank failed some calls")
	require.Positive(t, a.count("action=retry")+b.count("action=retry"), "a failed bank call was naked for redelivery")
}

// crashPoints are the boundaries where a consumer is SIGKILLed: around each tx
// phase's commit, around the bank call, and between the stored answer and the ack.
var crashPoints = []string{
	"record/before-commit",
	"record/after-commit",
	"bank_transfer/before-call",
	"bank_transfer/after-call",
	"settle/before-commit",
	"settle/after-commit",
	"ack/before",
}

func TestConsumerKilledAtEachBoundary(t *testing.T) {
	t.Parallel()
	for _, point := range crashPoints {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 0)
			doomed := r.consume([]string{envCrashAt + "=" + point}, "-workers", "1", "-ack-wait", "1s") // its deliveries come again
			const n = 3
			for i := range n {
				r.publish(fmt.Sprintf("msg-%d", i), payoutN(i))
			}
			doomed.killed(t)
			require.Contains(t, doomed.stderr(), "crash point "+point, "the fault fired")

			after := r.consume(nil, "-ack-wait", "1s")
			r.settled(ids(n), true)
			r.requireExactlyOnce(ids(n))
			require.Positive(t, after.count("delivered=2"), "the killed delivery came back")
		})
	}
}

// A payout whose delivery died and that the broker will never deliver again
// (MaxDeliver 1) is finished by the restarted consumer's sweeper.
func TestSweeperFinishesWhatIsNotRedelivered(t *testing.T) {
	t.Parallel()
	r := newRig(t, 0)
	doomed := r.consume([]string{envCrashAt + "=bank_transfer/after-call"}, "-workers", "1", "-max-deliver", "1")
	r.publish("msg-0", payoutN(0))
	doomed.killed(t)
	require.Contains(t, doomed.stderr(), "crash point bank_transfer/after-call")

	after := r.consume(nil, "-max-deliver", "1")
	r.settled(ids(1), false)
	r.requireExactlyOnce(ids(1))
	require.Equal(t, 1, after.count("swept payout=po_000"), "the sweeper took the payout")
	require.Zero(t, after.count("delivery payout="), "no redelivery")
}
