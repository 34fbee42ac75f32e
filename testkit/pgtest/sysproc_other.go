//go:build !unix

package pgtest

import "syscall"

// On systems without Unix credentials the server runs as this process's user (owner is
// always nil there: only a root process asks for another user).

func toolProcAttr(*osUser) *syscall.SysProcAttr { return nil }

func serverProcAttr(*osUser) *syscall.SysProcAttr { return nil }
