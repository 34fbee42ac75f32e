package idemclient_test

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestMain stops the throwaway Postgres of the SQL store example after the tests.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
