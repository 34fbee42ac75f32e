package idemhttp_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemflow/idemflow/internal/pgtest"
)

func TestMain(m *testing.M) {
	before := goleak.IgnoreCurrent() // what runs before the tests is not a leak of theirs
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(before); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
