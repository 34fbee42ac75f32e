package otelidemflow_test

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
