package attempt

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
