package childproc

import (
	"os"
	"runtime"
	"syscall"
)

// Kill ends this process with SIGKILL, as a crash would: no deferred function runs, no
// connection is closed cleanly. The signal is aimed at the calling thread first, so
// that the goroutine that reached the boundary takes no further step. It never returns.
func Kill() {
	runtime.LockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Stop stops this process with SIGSTOP before the calling goroutine takes another
// step, and returns after SIGCONT. kill(getpid(), SIGSTOP) is not enough: the kernel
// may hand a process-directed signal to another thread, and on a loaded machine the
// calling thread runs on for milliseconds (through a whole transaction) before the
// group stop reaches it. A signal aimed at the calling thread stops it on its way out
// of the system call.
func Stop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
