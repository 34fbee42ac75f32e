package otelsdk_test

import (
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }
