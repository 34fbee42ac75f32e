package keytable

// What the tests in package store_test see of the package beyond its API.

var (
	// ClaimHash is claimHash, for a test that holds a key's claim lock itself.
	ClaimHash = claimHash
	// ErrInvalid is errInvalid, which Classify wraps round a value the database refused.
	ErrInvalid = errInvalid
)

// PartitionLockSalt is partitionLockSalt, for a test that holds the maintenance lock.
const PartitionLockSalt = partitionLockSalt
