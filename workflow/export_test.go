package workflow

// Internals that the tests of package workflow_test reach.

// FingerprintV1 is the fingerprint that releases before v2 stored, to write such rows.
var FingerprintV1 = fingerprintV1

// MaxCanonicalDepth is the deepest nesting that Fingerprint canonicalises.
const MaxCanonicalDepth = maxCanonicalDepth
