//go:build unix && !linux

package childproc

import (
	"os"
	"syscall"
)

// Kill ends this process with SIGKILL, as a crash would. It never returns.
func Kill() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Stop stops this process with SIGSTOP and returns after SIGCONT. Without a
// thread-directed signal, the calling goroutine may take a few more steps first.
func Stop() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) }
