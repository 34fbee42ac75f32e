//go:build unix && !linux

package pgtest

import "syscall"

// toolProcAttr runs a short-lived tool (initdb) as owner, or as this process's user
// when owner is nil.
func toolProcAttr(owner *osUser) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: credential(owner)}
}

// serverProcAttr runs the server as owner. Without Linux's parent-death signal, a
// server whose test process dies before stopping it keeps running.
func serverProcAttr(owner *osUser) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: credential(owner)}
}

func credential(owner *osUser) *syscall.Credential {
	if owner == nil {
		return nil
	}
	return &syscall.Credential{Uid: uint32(owner.uid), Gid: uint32(owner.gid)}
}
