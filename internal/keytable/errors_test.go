package keytable_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"Serialization", pg("40001"), keytable.ErrConflict},
		{"Deadlock", pg("40P01"), keytable.ErrConflict},
		{"CheckViolation", pg("23514"), keytable.ErrInvalid},
		{"TooLong", pg("22001"), keytable.ErrInvalid},
		{"AdminShutdown", pg("57P01"), keytable.ErrUnavailable},
		{"ConnectionFailure", pg("08006"), keytable.ErrUnavailable},
		{"UnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), keytable.ErrUnavailable},
		{"ClosedConn", fmt.Errorf("write: %w", net.ErrClosed), keytable.ErrUnavailable},
		{"PreparedStatementExists", pg("42P05"), keytable.ErrMisconfigured},
		{"PreparedStatementMissing", pg("26000"), keytable.ErrMisconfigured},
		{"FeatureNotSupported", pg("0A000"), keytable.ErrRefused}, // Citus: not a router query
		{"SyntaxError", pg("42601"), keytable.ErrRefused},
		{"UndefinedTable", pg("42P01"), keytable.ErrRefused},
		{"UndefinedFunction", pg("42883"), keytable.ErrRefused},
		{"InsufficientPrivilege", pg("42501"), keytable.ErrRefused},
		{"InvalidSchemaName", pg("3F000"), keytable.ErrRefused},
		{"PreparedStatementBindMismatch", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "08P01",
			Message: `bind message supplies 1 parameters, but prepared statement "stmtcache_1" requires 2`}), keytable.ErrMisconfigured},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := keytable.Classify(c.err)
			require.ErrorIs(t, got, c.want)
			require.ErrorIs(t, got, c.err, "the original error stays in the chain")
		})
	}
	t.Run("ClosedMidRequest", func(t *testing.T) {
		// pgx v5.13's report of a connection closed by a failure while a batch's answer
		// was read: not safe to retry, the outcome unknown, so never ErrNotSent.
		err := fmt.Errorf("read batch: %w", pgconn.ErrConnClosed)
		require.False(t, pgconn.SafeToRetry(err))
		got := keytable.Classify(err)
		require.ErrorIs(t, got, keytable.ErrUnavailable)
		require.NotErrorIs(t, got, keytable.ErrNotSent)
		require.ErrorIs(t, got, err)
	})
	t.Run("OthersUnchanged", func(t *testing.T) {
		// read-only standby, lock timeout, Citus's internal errors: a retry may pass
		for _, err := range []error{pg("23505"), pg("25006"), pg("55P03"), pg("XX000"), errors.New("plain"), context.Canceled} {
			require.Equal(t, err, keytable.Classify(err))
		}
		require.NoError(t, keytable.Classify(nil))
	})
	t.Run("OursUnchanged", func(t *testing.T) {
		err := fmt.Errorf("x: %w", keytable.ErrNotFound)
		require.Equal(t, err, keytable.Classify(err))
	})
}
