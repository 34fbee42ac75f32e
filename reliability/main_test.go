package reliability

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
)

func TestMain(m *testing.M) {
	code := idemflowtest.Run(m)
	if chargesDir != "" {
		_ = os.RemoveAll(chargesDir)
	}
	os.Exit(code)
}
