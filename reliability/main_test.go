package reliability

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
)

func TestMain(m *testing.M) {
	code := idemflowtest.Run(m)
	builtMu.Lock()
	for _, dir := range builtDirs {
		_ = os.RemoveAll(dir)
	}
	builtMu.Unlock()
	os.Exit(code)
}
