package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
)

// pgssSettings load pg_stat_statements on a throwaway server: top-level statements
// only, planning time included. The overhead (a hash lookup and a spinlock per
// statement) is paid by every variant alike.
var pgssSettings = []string{
	"shared_preload_libraries=pg_stat_statements",
	"pg_stat_statements.track=top",
	"pg_stat_statements.track_planning=on",
	"pg_stat_statements.max=10000",
}

// stmtStat is one statement's counters, or their advance over a cell.
type stmtStat struct {
	Calls int64
	Exec  float64 // ms
	Plan  float64 // ms
	Rows  int64   // rows returned or affected
	Blks  int64   // shared buffers hit or read
}

// enablePgss creates pg_stat_statements where the admin connection reads it (the
// server's own database, so that reading it never counts in the bench database) and
// reports whether the server has it loaded.
func (e *env) enablePgss(ctx context.Context) bool {
	if _, err := e.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		logf("no statement breakdown: %v", err)
		return false
	}
	if err := e.admin.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = $1", e.db.name).Scan(&e.dbOID); err != nil {
		logf("no statement breakdown: %v", err)
		return false
	}
	if _, err := e.stmtSnapshot(ctx); err != nil {
		logf("no statement breakdown (pg_stat_statements is not in shared_preload_libraries?): %v", err)
		return false
	}
	return true
}

// stmtSnapshot reads the bench database's statement counters, without their texts.
func (e *env) stmtSnapshot(ctx context.Context) (map[int64]stmtStat, error) {
	rows, err := e.admin.Query(ctx, `SELECT queryid, calls, total_exec_time, total_plan_time, rows,
			shared_blks_hit + shared_blks_read
		FROM pg_stat_statements(false) WHERE dbid = $1 AND toplevel AND queryid IS NOT NULL`, e.dbOID)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	defer rows.Close()
	out := map[int64]stmtStat{}
	for rows.Next() {
		var id int64
		var s stmtStat
		if err := rows.Scan(&id, &s.Calls, &s.Exec, &s.Plan, &s.Rows, &s.Blks); err != nil {
			return nil, err
		}
		out[id] = s
	}
	return out, rows.Err()
}

// stmtDelta is after minus before, statements with no calls left out.
func stmtDelta(before, after map[int64]stmtStat) map[int64]stmtStat {
	out := map[int64]stmtStat{}
	for id, a := range after {
		b := before[id]
		if d := (stmtStat{a.Calls - b.Calls, a.Exec - b.Exec, a.Plan - b.Plan, a.Rows - b.Rows, a.Blks - b.Blks}); d.Calls > 0 {
			out[id] = d
		}
	}
	return out
}

// stmtTexts reads the texts of the bench database's statements.
func (e *env) stmtTexts(ctx context.Context) (map[int64]string, error) {
	rows, err := e.admin.Query(ctx, `SELECT queryid, query FROM pg_stat_statements(true)
		WHERE dbid = $1 AND toplevel AND queryid IS NOT NULL`, e.dbOID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var q string
		if err := rows.Scan(&id, &q); err != nil {
			return nil, err
		}
		out[id] = strings.Join(strings.Fields(q), " ")
	}
	return out, rows.Err()
}

// stmtRow is one statement of a variant, per request over all rounds at one concurrency.
type stmtRow struct {
	ID    int64
	Text  string
	Calls float64 // per request
	Exec  float64 // ms per request
	Plan  float64 // ms per request
}

func (s stmtRow) total() float64 { return s.Exec + s.Plan }

// stmtProfile is a variant's statements per request at one concurrency, the costliest
// first, summed over the rounds' cells.
func stmtProfile(cells []cell, variant string, conc int, texts map[int64]string) ([]stmtRow, bool) {
	sum := map[int64]stmtStat{}
	n := 0
	for _, c := range cells {
		if c.Variant != variant || c.Conc != conc || c.Stmts == nil {
			continue
		}
		n += c.N
		for id, s := range c.Stmts {
			t := sum[id]
			sum[id] = stmtStat{t.Calls + s.Calls, t.Exec + s.Exec, t.Plan + s.Plan, t.Rows + s.Rows, t.Blks + s.Blks}
		}
	}
	if n == 0 {
		return nil, false
	}
	var out []stmtRow
	for id, s := range sum {
		out = append(out, stmtRow{ID: id, Text: texts[id], Calls: float64(s.Calls) / float64(n),
			Exec: s.Exec / float64(n), Plan: s.Plan / float64(n)})
	}
	slices.SortFunc(out, func(a, b stmtRow) int {
		if a.total() != b.total() {
			return -cmpFloat(a.total(), b.total())
		}
		return cmpFloat(float64(a.ID), float64(b.ID))
	})
	return out, true
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func stmtTotals(rows []stmtRow) (calls, exec, plan float64) {
	for _, r := range rows {
		calls += r.Calls
		exec += r.Exec
		plan += r.Plan
	}
	return
}

// extraBreakdown writes where each idemflow shape's extra cost over its hand-written
// counterpart goes (Go-code over recipe-fused, pipelined over recipe-fused-safe): CPU per
// request on both sides at every concurrency, and the top statements by time at the
// largest concurrency, all from the rounds' cells.
func (r *report) extraBreakdown(b *strings.Builder) {
	for _, pair := range [][2]string{{vIdem, vFused}, {vIdemPipe, vSafe}} {
		r.pairBreakdown(b, pair[0], pair[1])
	}
}

// pairBreakdown writes where v's extra cost over ref goes.
func (r *report) pairBreakdown(b *strings.Builder, v, ref string) {
	aggs := aggregate(r.cells)
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	var lines []string
	for _, c := range r.opts.conc {
		i, ok1 := find(aggs, v, c)
		f, ok2 := find(aggs, ref, c)
		if !ok1 || !ok2 {
			continue
		}
		stI, haveI := stmtProfile(r.cells, v, c, r.stmtTexts)
		stF, haveF := stmtProfile(r.cells, ref, c, r.stmtTexts)
		stmtCol := "—"
		if haveI && haveF {
			_, ei, pi := stmtTotals(stI)
			_, ef, pf := stmtTotals(stF)
			stmtCol = fmt.Sprintf("%.3f / %.3f (%+.3f)", ei+pi, ef+pf, ei+pi-ef-pf)
		}
		sI, sF := i.Per.ServerCPU, f.Per.ServerCPU
		lines = append(lines, fmt.Sprintf("| %d | %s / %s (%s) | %.3f / %.3f (%+.3f) | %s / %s (%s) | %s | %.2f / %.2f | %.2f / %.2f |",
			c, fmt3(sI), fmt3(sF), fmtSigned(sI-sF), i.Per.ClientCPU, f.Per.ClientCPU, i.Per.ClientCPU-f.Per.ClientCPU,
			fmt3(sI+i.Per.ClientCPU), fmt3(sF+f.Per.ClientCPU), fmtSigned(sI+i.Per.ClientCPU-sF-f.Per.ClientCPU),
			stmtCol, i.Per.Statements, f.Per.Statements, i.Per.RoundTrips, f.Per.RoundTrips))
	}
	if len(lines) == 0 {
		return
	}
	p("\n## Where %s's extra goes, relative to %s\n\n", v, ref)
	p("Per fresh request, %s / %s (difference), medians over the rounds for CPU; statement time is summed over the rounds' cells. ", v, ref)
	p("Server CPU is every process of the server (from /proc, 10 ms ticks); client CPU is this process (getrusage), which also runs the fake provider for both. ")
	p("Statement time is pg_stat_statements' execution plus planning time of the bench database's top-level statements: wall time inside the server's executor, so it includes lock waits, and leaves out parsing, the protocol and commits. ")
	p("(PostgreSQL 15's pg_stat_statements does not record BEGIN and COMMIT sent in the extended protocol, as pgx sends them, and an implicit transaction's commit is in no statement: the WAL flush at commit is in neither column of statement time, for either variant; it is in server CPU.) ")
	p("Server CPU minus statement time is roughly what the server spends outside the executor: protocol, parse and bind, commit, WAL writing, autovacuum.\n\n")
	p("| conc | server CPU ms | client CPU ms | server + client CPU ms | statement time ms | statements | round trips |\n|---|---|---|---|---|---|---|\n")
	for _, l := range lines {
		p("%s\n", l)
	}
	c := slices.Max(r.opts.conc)
	stI, haveI := stmtProfile(r.cells, v, c, r.stmtTexts)
	stF, haveF := stmtProfile(r.cells, ref, c, r.stmtTexts)
	if !haveI || !haveF {
		p("\nNo per-statement breakdown: pg_stat_statements is not loaded on this server (the throwaway server loads it; for `$DATABASE_URL` add it to shared_preload_libraries).\n")
		return
	}
	for _, side := range []struct {
		name string
		rows []stmtRow
	}{{v, stI}, {ref, stF}} {
		calls, exec, plan := stmtTotals(side.rows)
		p("\nTop statements of %s at concurrency %d by time per request (all its statements: %.2f calls, %.3f ms executing, %.3f ms planning):\n\n", side.name, c, calls, exec, plan)
		p("| statement | calls | exec ms | plan ms | mean ms per call |\n|---|---|---|---|---|\n")
		for i, s := range side.rows {
			if i == 8 {
				break
			}
			p("| `%s` | %.2f | %.3f | %.3f | %.3f |\n", shortStmt(s.Text), s.Calls, s.Exec, s.Plan, s.total()/s.Calls)
		}
	}
}

// shortStmt shortens a statement's text for a table cell.
func shortStmt(q string) string {
	if q == "" {
		q = "(text not recorded)"
	}
	q = strings.ReplaceAll(q, "|", "\\|")
	q = strings.ReplaceAll(q, "`", "'")
	if len(q) > 110 {
		q = q[:107] + "..."
	}
	return q
}

func fmt3(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.3f", x)
}

func fmtSigned(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%+.3f", x)
}
