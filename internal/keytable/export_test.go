package keytable

// What the tests in package store_test see of the package beyond its API.

var (
	// ErrInvalid is errInvalid, which Classify wraps round a value the database refused.
	ErrInvalid = errInvalid
	// ErrScanSingleOnPartitioned is errScanSingleOnPartitioned: a Store made with
	// ScanSingle was used on a partitioned key table.
	ErrScanSingleOnPartitioned = errScanSingleOnPartitioned
)

// PartitionLockSalt is partitionLockSalt, for a test that holds the maintenance lock.
const PartitionLockSalt = partitionLockSalt

// SQLCommitFlushed is sqlCommitFlushed, the statement a KeyWrite with Flushed queues
// after its write, for a test of the statement alone.
const SQLCommitFlushed = sqlCommitFlushed
