//go:build linux

package pgtest

import "syscall"

// toolProcAttr runs a short-lived tool (initdb) as owner, or as this process's user
// when owner is nil.
func toolProcAttr(owner *osUser) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: credential(owner)}
}

// serverProcAttr runs the server as owner and has the kernel send it SIGQUIT (immediate
// shutdown) if this process dies without stopping it.
func serverProcAttr(owner *osUser) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: credential(owner), Pdeathsig: syscall.SIGQUIT}
}

func credential(owner *osUser) *syscall.Credential {
	if owner == nil {
		return nil
	}
	// Groups is empty, so root's supplementary groups are dropped too.
	return &syscall.Credential{Uid: uint32(owner.uid), Gid: uint32(owner.gid)}
}
