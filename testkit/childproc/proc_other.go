//go:build !unix

package childproc

import "testing"

// Child is a child process; child processes need a Unix system.
type Child struct{}

// Start fails the test: child processes need a Unix system.
func Start(t testing.TB, run string, env ...string) *Child {
	t.Helper()
	t.Fatalf("childproc: child processes need a Unix system")
	return nil
}

// Killed is never reached (Start fails).
func (c *Child) Killed(t testing.TB) (bool, [][]byte) { return false, nil }

// Kill ends this process at once.
func Kill() { panic("childproc: child processes need a Unix system") }

// Stop is not supported.
func Stop() { panic("childproc: child processes need a Unix system") }
