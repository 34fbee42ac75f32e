package reliability

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
)

func TestMain(m *testing.M) {
	code := idemflowtest.Run(m)
	for _, dir := range []string{chargesDir, cliDir, payoutsDir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}
