package keytable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/vocab"
)

// The errors of the database and of fencing are the engine's vocabulary's values
// (package outcome, at the bottom of the engine), so that every layer above matches
// the same value with errors.Is; this package returns them, translated from pgx's
// errors (Classify).
var (
	// ErrNotFound: no key row matches.
	ErrNotFound = vocab.ErrNotFound
	// ErrLeaseLost: a fenced statement matched no row. The key was taken over (its lock
	// version moved), finished or deleted by someone else; the caller's transaction, if
	// any, is aborted.
	ErrLeaseLost = vocab.ErrLeaseLost
	// ErrClaimBusy: another attempt holds the key's claim lock: it is running the key's
	// first transaction right now. Nothing was written.
	ErrClaimBusy = vocab.ErrClaimBusy
	// ErrClaimExists: a new key's insert found its row already there; the transaction
	// is aborted. Look the row up.
	ErrClaimExists = vocab.ErrClaimExists
	// ErrConflict: a serialization failure or deadlock; the whole transaction may be
	// retried.
	ErrConflict = vocab.ErrConflict
	// ErrUnavailable: the database could not be reached or the connection broke. If the
	// statement was a COMMIT, its outcome is unknown unless ErrNotSent is also matched.
	ErrUnavailable = vocab.ErrUnavailable
	// ErrMisconfigured: the server refused a statement in a way only the connection's
	// settings cause: a prepared statement that already exists (42P05) or does not
	// exist (26000, or 08P01 about one) on the server connection. That is pgx's
	// default query exec mode, which keeps named prepared statements per connection,
	// behind a pooler in transaction mode that does not keep them (pgbouncer before
	// 1.21, or with max_prepared_statements = 0). Retrying does not help; the message
	// names the fix.
	ErrMisconfigured = vocab.ErrMisconfigured
	// ErrRefused: the server refused a statement in a way that retrying cannot change
	// (see Classify for the SQLSTATEs): a feature it does not support (0A000, which
	// Citus answers for a statement it cannot run on a distributed table), a syntax
	// error, an object that does not exist or may not be used (class 42), a schema or
	// database that does not exist (3F000, 3D000). The wrapped error says which.
	ErrRefused = vocab.ErrRefused
)

var (
	// ErrNotTaken: a takeover found the key's lease live, or the key no longer in the
	// state the caller saw.
	ErrNotTaken = errors.New("key not taken over")
	// ErrNotSent: the failed request never reached the server (always with
	// ErrUnavailable); nothing it carried took effect.
	ErrNotSent = errors.New("request not sent")
	// errInvalid: the database refused a value (a CHECK constraint, a length or format
	// limit). Nothing was written. The engine validates what it writes first, so
	// nothing branches on it; it marks the error as ours for Classify.
	errInvalid = errors.New("value refused by the database")
)

// SQLSTATEs the engine's own statements are read for. A fenced statement aborts its
// transaction by dividing by zero; 22012 means that only when it comes from one, so it
// is never translated by Classify.
const (
	codeDivisionByZero  = "22012"
	codeUniqueViolation = "23505"
)

// fenceErr translates the error of a fenced statement: a division by zero is the fence
// missing.
func fenceErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeDivisionByZero {
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return Classify(err)
}

// Classify translates an error from pgx into this package's errors, wrapping the
// original. Errors that are already ours, context errors and unknown errors come back
// unchanged.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	for _, ours := range []error{ErrNotFound, ErrLeaseLost, ErrNotTaken, ErrClaimBusy, ErrClaimExists, ErrConflict, ErrUnavailable, ErrMisconfigured, ErrRefused, errInvalid} {
		if errors.Is(err, ours) {
			return err
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001" || pgErr.Code == "40P01":
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case noPartition(pgErr): // partitioned key table (partition.go)
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		case partitionGone(pgErr): // a statement sent to the row's partition (partition.go)
			return fmt.Errorf("%w: the row's partition no longer exists: %w", ErrLeaseLost, err)
		case pgErr.Code == "23514" || pgErr.Code == "22001" || pgErr.Code == "54000":
			return fmt.Errorf("%w: %w", errInvalid, err)
		case pgErr.Code == "42P05" || pgErr.Code == "26000" ||
			pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "prepared statement"):
			return fmt.Errorf("%w: %w", ErrMisconfigured, err)
		case refused(pgErr.Code):
			return fmt.Errorf("%w: %w", ErrRefused, err)
		case len(pgErr.Code) == 5 && (pgErr.Code[:2] == "08" || pgErr.Code[:2] == "57"):
			// connection exceptions and operator intervention (shutdown, terminated backend)
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// pgx closes the connection when a context ends mid-request; the outcome of what
		// was in flight is as unknown as on a network error.
		if pgconn.SafeToRetry(err) {
			return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrNotSent, err)
		}
		return err
	}
	if pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrNotSent, err)
	}
	if pgconn.Timeout(err) || isNetwork(err) || errors.Is(err, pgconn.ErrConnClosed) {
		// pgx (v5.13 on) reports a connection that a failure closed while a request was
		// in flight as ErrConnClosed, not safe to retry: what the request carried may
		// have taken effect.
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// refused reports whether SQLSTATE code is a permanent refusal (ErrRefused): class 0A
// (feature not supported), class 42 (syntax error or access rule violation) but
// 42P05 (a prepared statement that exists: ErrMisconfigured, checked first), 3F000
// (invalid schema name) and 3D000 (invalid catalog name). Errors a retry can clear
// are not among them: serialization failures and deadlocks (class 40), lock and
// statement timeouts (55P03, 57014), a read-only transaction on a standby that may be
// promoted (25006), too many connections (53300), and Citus's internal errors
// (XX000), which it raises for transient faults between nodes too.
func refused(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch class := code[:2]; {
	case class == "0A", class == "42":
		return true
	}
	return code == "3F000" || code == "3D000"
}

func isNetwork(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) ||
		errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED)
}
