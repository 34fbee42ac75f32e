package browser_test

import (
	"os"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/uitest"
)

// TestMain runs the tests, or, in a child process, the crashed server of
// uitest.Fixture.Crash (idemflowtest.Run runs a registered child program first).
func TestMain(m *testing.M) { os.Exit(idemflowtest.Run(m, closeBrowser)) }

// token is the write token of the fixtures that allow writes.
const token = uitest.Token

// fixture is the page on a fresh schema (testkit/uitest, shared with idemflowui's HTTP
// tests).
type fixture struct{ *uitest.Fixture }

// setup serves the page with opts (nil: read-only) on a fresh schema.
func setup(t *testing.T, opts *idemflowui.Options) *fixture {
	t.Helper()
	return &fixture{uitest.Setup(t, opts)}
}

func writable() *idemflowui.Options { return uitest.Writable() }
