package idemflowtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A crash matrix runs each case's attempt in a child: the test binary re-executed with
// -test.run naming the test and envCrash holding a caseSpec. The child runs the test
// function again from the top; NewDB and NewRemote hand back the parent's database and
// remotes, in the order the test made them, and the matrix call runs the one attempt
// and dies at its boundary.
const envCrash = "IDEMFLOWTEST_CASE"

// caseSpec is what a child is asked to do.
type caseSpec struct {
	Test     string   // the test's full name
	Call     int      // which matrix call of the test (1 for the first)
	Mode     string   // request: run Request and die at Boundary; sweep: one sweeper pass that dies at the first boundary it reaches
	Boundary string   // request mode
	Key      string   // the case's idempotency key
	App      string   // application_name of the child's sessions
	DBs      []string // URLs of the databases the test made, in order
	Remotes  []string // URLs of the remotes the test made, in order
}

// childLine is a line a child prints: the boundary it reached, or a sweep's result.
type childLine struct {
	Fired    string `json:",omitempty"`
	Taken    int    `json:",omitempty"`
	Finished int    `json:",omitempty"`
}

// child is this process's case when it is a crash matrix's child, else nil.
var child = readCaseSpec()

func readCaseSpec() *childState {
	raw := os.Getenv(envCrash)
	if raw == "" {
		return nil
	}
	var s caseSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintf(os.Stderr, "idemflowtest: %s: %v\n", envCrash, err)
		os.Exit(2)
	}
	return &childState{spec: s}
}

// childState hands out the parent's databases and remotes in order.
type childState struct {
	spec caseSpec

	mu           sync.Mutex
	dbs, remotes int
}

func (c *childState) db(t testing.TB) *DB {
	t.Helper()
	url := c.next(t, &c.dbs, c.spec.DBs, "databases")
	return &DB{Pool: childPool(t, url), URL: url, Schema: schemaOf(url)}
}

func (c *childState) remote(t testing.TB) string {
	t.Helper()
	return c.next(t, &c.remotes, c.spec.Remotes, "remotes")
}

// next hands out the parent's values in order; *n counts those handed out.
func (c *childState) next(t testing.TB, n *int, values []string, what string) string {
	t.Helper()
	c.mu.Lock()
	i := *n
	*n++
	c.mu.Unlock()
	if i >= len(values) {
		t.Fatalf("idemflowtest: crash child: the test made more %s than its parent (%d)", what, len(values))
	}
	return values[i]
}

// childPool opens a pool whose sessions carry the child's application_name, so that
// the parent can wait until the server has ended them.
func childPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("idemflowtest: pool config: %v", err)
	}
	if child != nil {
		cfg.ConnConfig.RuntimeParams["application_name"] = child.spec.App
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("idemflowtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func schemaOf(url string) string {
	if cfg, err := pgxpool.ParseConfig(url); err == nil {
		return cfg.ConnConfig.RuntimeParams["search_path"]
	}
	return ""
}

// shares records, in the parent, the databases and remotes each test made, so that a
// matrix can hand them to its children in the same order.
var shares = &shareLog{}

type shareKind int

const (
	shareDB shareKind = iota
	shareRemote
)

type share struct {
	test  string
	kind  shareKind
	value string
}

type shareLog struct {
	mu  sync.Mutex
	all []*share
}

func (l *shareLog) add(t testing.TB, kind shareKind, value string) {
	s := &share{test: t.Name(), kind: kind, value: value}
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, o := range l.all {
			if o == s {
				l.all = append(l.all[:i], l.all[i+1:]...)
				break
			}
		}
	})
}

// of returns the values of kind made by test or the tests it runs in, in order.
func (l *shareLog) of(test string, kind shareKind) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.all {
		if s.kind == kind && (s.test == test || strings.HasPrefix(test, s.test+"/")) {
			out = append(out, s.value)
		}
	}
	return out
}

// nextCall numbers the matrix calls of one run of a test (a -count=2 run is two), the
// same way in parent and child.
func nextCall(t testing.TB) int {
	callsMu.Lock()
	defer callsMu.Unlock()
	if calls[t] == 0 {
		t.Cleanup(func() {
			callsMu.Lock()
			defer callsMu.Unlock()
			delete(calls, t)
		})
	}
	calls[t]++
	return calls[t]
}

var (
	callsMu sync.Mutex
	calls   = map[testing.TB]int{}
)

// runPattern is the -test.run pattern that runs exactly the test named name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
