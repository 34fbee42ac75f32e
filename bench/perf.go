package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemflow/idemflow/testkit/cpumeter"
)

// perfSymbols are the server functions whose share of the server's CPU samples the
// profile reports (inclusive: the function and what it calls).
var perfSymbols = []struct{ sym, what string }{
	{"PortalRun", "executing statements"},
	{"ExecConstraints", "CHECK constraints (parsed and compiled per statement)"},
	{"XLogFlush", "WAL flush at commit"},
	{"XLogInsert", "WAL insert"},
	{"pq_getbyte", "waiting for the client"},
	{"standard_ExecutorStart", "executor start-up"},
}

// perfProfile is the share of one variant's server CPU samples per symbol.
type perfProfile struct {
	Variant string
	Conc    int
	Samples int
	Share   map[string]float64 // symbol -> percent of samples (inclusive)
}

// perfProfiles samples the database server's processes with Linux perf while each
// variant runs alone at concurrency conc, when perf is installed and the server is a
// local process. It returns nothing where it cannot.
func (e *env) perfProfiles(ctx context.Context, conc int, dur time.Duration) []perfProfile {
	perf, err := exec.LookPath("perf")
	if err != nil || !e.cpu.Local() {
		logf("no perf profile: perf not installed or the server is not local")
		return nil
	}
	dir, err := os.MkdirTemp("", "idemflow-bench-perf-")
	if err != nil {
		return nil
	}
	defer os.RemoveAll(dir)
	var out []perfProfile
	for _, v := range e.variants {
		file := filepath.Join(dir, v.name+".data")
		done := make(chan load, 1)
		go func() { done <- e.runLoad(ctx, v.fast, conc, dur+time.Second, nil) }()
		time.Sleep(500 * time.Millisecond) // let the load settle
		pids := e.serverPIDs()
		rec := exec.CommandContext(ctx, perf, "record", "-F", "999", "-g", "-o", file, "-p", pids, "--", "sleep", strconv.Itoa(int(dur.Seconds())))
		recOut, recErr := rec.CombinedOutput()
		l := <-done
		if l.errs > 0 {
			logf("perf profile of %s: %v", v.name, l.firstErr)
			return out
		}
		if recErr != nil {
			logf("no perf profile: perf record: %v: %s", recErr, bytes.TrimSpace(recOut))
			return nil
		}
		rep, err := exec.CommandContext(ctx, perf, "report", "-i", file, "--children", "--sort", "symbol", "--stdio").Output()
		if err != nil {
			logf("no perf profile: perf report: %v", err)
			return nil
		}
		p := perfProfile{Variant: v.name, Conc: conc, Share: map[string]float64{}}
		sc := bufio.NewScanner(bytes.NewReader(rep))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "# Samples:") {
				f := strings.Fields(line)
				if len(f) >= 3 {
					p.Samples = parseCount(f[2])
				}
				continue
			}
			f := strings.Fields(line)
			// "    21.05%     0.46%  [.] __brk   -   -"
			if len(f) < 4 || !strings.HasSuffix(f[0], "%") || !strings.HasPrefix(f[2], "[") {
				continue
			}
			pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
			if err != nil {
				continue
			}
			for _, s := range perfSymbols {
				if f[3] == s.sym {
					p.Share[s.sym] = max(p.Share[s.sym], pct)
				}
			}
		}
		logf("perf profile: %-16s %s", v.name, fmtShares(p))
		out = append(out, p)
	}
	return out
}

func fmtShares(p perfProfile) string {
	var s []string
	for _, sym := range perfSymbols {
		s = append(s, fmt.Sprintf("%s %.1f%%", sym.sym, p.Share[sym.sym]))
	}
	return strings.Join(s, ", ")
}

// parseCount reads perf's sample count ("9K", "912").
func parseCount(s string) int {
	mul := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1000, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mul, s = 1000000, strings.TrimSuffix(s, "M")
	}
	n, _ := strconv.ParseFloat(s, 64)
	return int(n * float64(mul))
}

// serverPIDs lists the server's backends on the bench database, comma-separated.
func (e *env) serverPIDs() string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		ppid, _, ok := cpumeter.ProcStat(pid)
		if !ok || ppid != e.cpu.Postmaster() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(e.db.name)) {
			pids = append(pids, d.Name())
		}
	}
	return strings.Join(pids, ",")
}
