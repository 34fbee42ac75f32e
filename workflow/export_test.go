package workflow

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/internal/fingerprint"
	"github.com/idemflow/idemflow/internal/keytable"
)

// Internals that the tests of package workflow_test reach.

// ClaimHash is the hash a key's claim lock is made from, for a test that holds it.
var ClaimHash = keytable.ClaimHash

// FingerprintV1 is the fingerprint that releases before v2 stored, to write such rows.
var FingerprintV1 = fingerprint.V1

// WholeFingerprint is the version 2 fingerprint, Fingerprint's without members.
var WholeFingerprint = fingerprint.Whole

// MaxCanonicalDepth is the deepest nesting that Fingerprint canonicalises.
const MaxCanonicalDepth = fingerprint.MaxCanonicalDepth

// StartUp runs e's start-up check (partition.go) now, on a connection of its pool, as
// its first request would: a test that counts the statements of e's requests calls it
// first and counts from then on.
func StartUp(ctx context.Context, e *Engine) error {
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release()
	e.startupCheck(ctx, pc)
	return nil
}

// SetPollFloor makes e's watches poll a remote owner first after d (then backing off
// as usual), so that a test of the poll path need not wait a sixteenth of its bound.
// Call it before e is used.
func SetPollFloor(e *Engine, d time.Duration) { e.waits.pollFloor = d }

// ObserveWaits has f told of every step of e's watches: "watch" when one starts,
// "poll" for each look-up it sends, "wake" when it hands its waiters a row. Call it
// before e is used.
func ObserveWaits(e *Engine, f func(step string)) {
	e.waits.observe = func(step string, _ waitKey) { f(step) }
}

// FingerprintMatches is fingerprintMatches, for TestFingerprintMatches.
var FingerprintMatches = fingerprint.MatchesWhole
