package matrix

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Environment variables of the matrix (docs/RELIABILITY.md, "The state matrix").
const (
	envNightly = "IDEMFLOW_NIGHTLY"      // "1": every cell
	envSeed    = "IDEMFLOW_MATRIX_SEED"  // the quick tier's seed (default: the clock)
	envCells   = "IDEMFLOW_MATRIX_CELLS" // the quick tier's sample size (default quickCells)
)

// quickCells is the quick tier's sample size: each cell costs a schema, three pools
// and two races, about 2–4 s on a loaded 2-core machine, two at a time.
const quickCells = 8

// shape is how a flow's first step is built.
type shape string

const (
	shapeTx         shape = "tx"         // Go-code tx phase, call, Go-code tx phase
	shapePipelined  shape = "pipelined"  // pipelined tx phase reading its results (explicit transaction), call, the same
	shapeImplicit   shape = "implicit"   // pipelined tx phase in one round trip (implicit transaction), call, the same
	shapeCallFirst  shape = "callfirst"  // call phase, Go-code tx phase
	shapeMiddleware shape = "middleware" // idemhttp.Middleware around a plain handler
	shapeAlone      shape = "alone"      // a Go-code tx phase that answers with phases.Fail: the answer stored alone
)

var shapes = []shape{shapeTx, shapePipelined, shapeImplicit, shapeCallFirst, shapeMiddleware, shapeAlone}

// layout is the key table's layout and what the engines learnt of it.
type layout string

const (
	layoutPlain       layout = "plain"
	layoutLearnt      layout = "partitioned-learnt"   // the start-up check read the layout
	layoutUnlearnt    layout = "partitioned-unlearnt" // the start-up check's connection was terminated
	crashNone                = "none"
	middlewarePhaseID        = "handle" // idemhttp's middleware flow's one call phase
)

var layouts = []layout{layoutPlain, layoutLearnt, layoutUnlearnt}

var modes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// pooledModes are the exec modes valid through pgbouncer 1.18 in transaction mode
// (pgtest's, without max_prepared_statements): the others keep server-side prepared
// statements, named (cache_statement) or unnamed across round trips (describe_exec),
// that the pooler hands to other clients or loses between transactions.
var pooledModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// cell is one combination of the matrix.
type cell struct {
	shape  shape
	layout layout
	mode   pgx.QueryExecMode
	warm   bool
	pooled bool   // through pgbouncer in transaction mode
	crash  string // the boundary an attempt is abandoned at before the race, or crashNone
}

// name is the cell's coordinates, the subtest's name.
func (c cell) name() string {
	conn, via := "cold", "direct"
	if c.warm {
		conn = "warm"
	}
	if c.pooled {
		via = "pgbouncer"
	}
	return strings.Join([]string{string(c.shape), string(c.layout), modeName(c.mode), conn, via, strings.ReplaceAll(c.crash, "/", ".")}, "/")
}

func modeName(m pgx.QueryExecMode) string { return strings.ReplaceAll(m.String(), " ", "_") }

func (c cell) partitioned() bool { return c.layout != layoutPlain }

// unreachable lists the boundaries of a shape's flow (idemflowtest.Boundaries) that no
// attempt reaches: a phase answered with phases.Fail rolls back, so it has no commit;
// its answer is stored alone.
var unreachable = map[shape][]string{shapeAlone: {"debit/before-commit", "debit/after-commit"}}

// crashPoints are the boundaries the matrix abandons an attempt at for a shape: the
// test kit's (idemflowtest.Boundaries of the shape's flow) that an attempt reaches,
// and crashNone.
func crashPoints(s shape) []string {
	f := shapeFlow(s, nil)
	if s == shapeMiddleware { // the middleware's flow is registered by idemhttp: one call phase
		f = phases.Flow{Name: "m", Phases: []phases.Phase{phases.Call(middlewarePhaseID, nil)}}
	}
	out := []string{crashNone}
	for _, b := range idemflowtest.Boundaries(f) {
		if !slices.Contains(unreachable[s], b.String()) {
			out = append(out, b.String())
		}
	}
	return out
}

// exclusion is a class of combinations the matrix does not run, and why.
type exclusion struct {
	what, why string
	n         int
}

// allCells enumerates the matrix in a fixed order, and the combinations excluded.
func allCells() ([]cell, []exclusion) {
	var cells []cell
	pooler := exclusion{what: "pgbouncer × cache_statement, describe_exec", why: "server-side prepared statements across transactions; pgbouncer 1.18 has no max_prepared_statements"}
	crash := exclusion{what: "alone × debit/before-commit, debit/after-commit", why: "a phase answered with phases.Fail never commits: its answer is stored alone"}
	for _, s := range shapes {
		points := crashPoints(s)
		crash.n += len(unreachable[s]) * len(layouts) * 2 * (len(modes) + len(pooledModes))
		for _, l := range layouts {
			for _, m := range modes {
				for _, warm := range []bool{false, true} {
					for _, pooled := range []bool{false, true} {
						if pooled && !slices.Contains(pooledModes, m) {
							pooler.n += len(points)
							continue
						}
						for _, p := range points {
							cells = append(cells, cell{shape: s, layout: l, mode: m, warm: warm, pooled: pooled, crash: p})
						}
					}
				}
			}
		}
	}
	return cells, []exclusion{pooler, crash}
}

// sample picks n cells by seed, stratified so that a small sample still covers every
// shape, layout and exec mode: the i-th pick takes the i-th of each (from offsets the
// seed chooses) and the rest of its coordinates at random.
func sample(all []cell, seed uint64, n int) []cell {
	r := rand.New(rand.NewPCG(seed, seed^0x6d6174726978))
	o1, o2, o3 := r.IntN(len(shapes)), r.IntN(len(layouts)), r.IntN(len(modes))
	var out []cell
	for i := 0; len(out) < n && i < 10*n; i++ {
		s, l, m := shapes[(o1+i)%len(shapes)], layouts[(o2+i)%len(layouts)], modes[(o3+i)%len(modes)]
		var cands []cell
		for _, c := range all {
			if c.shape == s && c.layout == l && c.mode == m && !slices.Contains(out, c) {
				cands = append(cands, c)
			}
		}
		if len(cands) > 0 {
			out = append(out, cands[r.IntN(len(cands))])
		}
	}
	return out
}

// seed is IDEMFLOW_MATRIX_SEED, or the clock's.
func seed(t *testing.T) uint64 {
	if s := os.Getenv(envSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// TestMatrix runs the state matrix: in the quick tier a sample of cells chosen by a
// logged seed, in the nightly tier (IDEMFLOW_NIGHTLY=1) every cell. See runCell for
// what one cell does and checks.
func TestMatrix(t *testing.T) {
	pgtest.RequirePgbouncer(t)
	all, excluded := allCells()
	for _, e := range excluded {
		t.Logf("excluded: %s: %d combinations (%s)", e.what, e.n, e.why)
	}
	run, sd := all, seed(t)
	if os.Getenv(envNightly) == "1" {
		t.Logf("matrix: nightly tier, all %d cells", len(all))
	} else {
		n := quickCells
		if s := os.Getenv(envCells); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				t.Fatalf("%s=%q: want a positive number", envCells, s)
			}
			n = v
		}
		run = sample(all, sd, n)
		t.Logf("matrix: quick tier, %d of %d cells, seed %d (replay: %s=%d go test -run TestMatrix ./testkit/matrix/)", len(run), len(all), sd, envSeed, sd)
	}
	for _, c := range run {
		t.Run(c.name(), func(t *testing.T) {
			t.Parallel()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("cell %s failed (seed %d); replay this cell: %s=1 go test -run 'TestMatrix/%s$' ./testkit/matrix/", c.name(), sd, envNightly, c.name())
				}
			})
			runCell(t, c)
		})
	}
}

// TestSample: a seed picks the same cells every time, and every shape, layout and
// exec mode is in a sample of quickCells.
func TestSample(t *testing.T) {
	all, _ := allCells()
	a, b := sample(all, 42, quickCells), sample(all, 42, quickCells)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 picked %v, then %v", a, b)
	}
	if len(a) != quickCells {
		t.Fatalf("picked %d cells, want %d", len(a), quickCells)
	}
	seen := map[string]bool{}
	for _, c := range a {
		seen[string(c.shape)], seen[string(c.layout)], seen[modeName(c.mode)] = true, true, true
	}
	for _, s := range shapes {
		if !seen[string(s)] {
			t.Errorf("no %s cell in %v", s, a)
		}
	}
	for _, l := range layouts {
		if !seen[string(l)] {
			t.Errorf("no %s cell in %v", l, a)
		}
	}
	for _, m := range modes {
		if !seen[modeName(m)] {
			t.Errorf("no %s cell in %v", modeName(m), a)
		}
	}
	t.Logf("%d cells in all; seed 42 picks %s", len(all), fmt.Sprint(names(a)))
}

func names(cs []cell) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name()
	}
	return out
}
