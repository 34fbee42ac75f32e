package reliability

import (
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemflow/idemflow/internal/pgtest"
)

func TestMain(m *testing.M) {
	if runChildIfAsked() { // this process is a child of an experiment, not a test run
		return
	}
	before := goleak.IgnoreCurrent() // taken before the tests, so that their leaks show
	code := pgtest.Main(m)
	if chargesDir != "" {
		_ = os.RemoveAll(chargesDir)
	}
	if code == 0 {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		if err := goleak.Find(before); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
