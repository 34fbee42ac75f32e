package workflow

import "time"

// Internals that the tests of package workflow_test reach.

// FingerprintV1 is the fingerprint that releases before v2 stored, to write such rows.
var FingerprintV1 = fingerprintV1

// MaxCanonicalDepth is the deepest nesting that Fingerprint canonicalises.
const MaxCanonicalDepth = maxCanonicalDepth

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
var FingerprintMatches = fingerprintMatches
