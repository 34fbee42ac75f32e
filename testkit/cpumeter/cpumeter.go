// Package cpumeter reads CPU time for benchmarks: this process's, and the database
// server's (the postmaster and all its children) when the server runs on this
// machine, from getrusage and /proc.
//
// This package imports none of idemflow's packages.
package cpumeter

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Meter reads CPU time: this process's (the client, with whatever runs in it) and the
// database server's (the postmaster and all its children: backends, walwriter,
// checkpointer, autovacuum), when the server runs on this machine.
type Meter struct {
	postmaster int // 0 when the server's processes cannot be seen
}

// clockTick is the unit of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// Querier runs a query on the database server: a connection or a pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// New returns a meter for the server db is connected to.
func New(ctx context.Context, db Querier) *Meter {
	var pid int
	if err := db.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return &Meter{}
	}
	ppid, _, ok := ProcStat(pid)
	if !ok {
		return &Meter{}
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ppid), "comm"))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return &Meter{}
	}
	return &Meter{postmaster: ppid}
}

// Local reports whether the server's CPU time can be read.
func (m *Meter) Local() bool { return m.postmaster != 0 }

// Postmaster is the server's postmaster process id, 0 unless Local.
func (m *Meter) Postmaster() int { return m.postmaster }

// Times is a reading.
type Times struct{ Client, Server time.Duration }

// Read reads both clocks. The /proc scan for the server's time costs this process CPU
// of its own: at the start of a window (end false) the client's clock is read after
// the scan, at the end before it, so that the scans fall outside the window.
func (m *Meter) Read(end bool) Times {
	var t Times
	if end {
		t.Client = Self()
	}
	t.Server = m.serverCPU()
	if !end {
		t.Client = Self()
	}
	return t
}

// Self is this process's user + system time.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the user + system time of the postmaster and its children.
func (m *Meter) serverCPU() time.Duration {
	if m.postmaster == 0 {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, cpu, ok := ProcStat(pid)
		if ok && (pid == m.postmaster || ppid == m.postmaster) {
			sum += cpu
		}
	}
	return sum
}

// ProcStat returns a process's parent and its user+system CPU time.
func ProcStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may hold spaces: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	utime, err2 := strconv.ParseInt(f[11], 10, 64)
	stime, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return ppid, time.Duration(utime+stime) * clockTick, true
}
