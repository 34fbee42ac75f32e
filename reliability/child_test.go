package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/workflow"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Child processes are this test binary re-executed as childproc's program "reliability"
// with envChild set to a JSON childConfig. A child SIGKILLs itself (a crash: no deferred
// functions, no connection cleanup) or SIGSTOPs itself (a pause: a zombie once the
// parent lets its lease run out) at a point of its run: one of childproc's boundary
// names ("<phase>/after-claim", "<phase>/start", "<phase>/before-commit",
// "<phase>/after-commit", "<phase>/before-call", "<phase>/after-call", "claimed",
// "taken-over", "swept", "finished"; see childproc.Points).
const envChild = "IDEMFLOW_REL_CHILD"

func init() { childproc.Register("reliability", runChild) }

type childConfig struct {
	Mode        string // do: run Requests in order; sweep: sweeper passes until one takes nothing
	DBURL       string
	ProviderURL string
	Lease       time.Duration
	Params      map[string]string // run-time parameters of the child's pool
	AppName     string
	// Point is where the child kills or pauses itself; Nth picks the
	// Nth time the point is reached (0 means the first).
	Point  string
	Action string // kill or stop
	Nth    int
	// Requests are run one after the other by mode do.
	Requests []workflow.Request
	// Side are the ledger flow's side channels, if the env has them.
	Side *sideCfg `json:",omitempty"`
	// Shape is the shape of the flows' tx phases (env.shape).
	Shape flowShape
}

// childLine is one line a child prints on stdout.
type childLine struct {
	Event  string               // fired, answer, stats, done
	Point  string               `json:",omitempty"`
	Key    string               `json:",omitempty"`
	Answer *answer              `json:",omitempty"`
	Stats  *workflow.SweepStats `json:",omitempty"`
	// Ran (done) counts the flows' statements the server ran after the point fired
	// (ranAfter).
	Ran int64 `json:",omitempty"`
}

// runChild is a child's work, as its childConfig says.
func runChild() {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(envChild)), &cfg); err != nil {
		childproc.Fail("config", err)
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(cfg.DBURL)
	if err != nil {
		childproc.Fail("pool config", err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.AppName
	for k, v := range cfg.Params {
		pcfg.ConnConfig.RuntimeParams[k] = v
	}
	ran := &ranAfter{}
	pcfg.ConnConfig.Tracer = ran
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		childproc.Fail("connect", err)
	}
	pts := childproc.NewPoints(cfg.Point, cfg.Nth, func(at string) {
		childproc.Emit(childLine{Event: "fired", Point: at})
		ran.fired.Store(true)
		switch cfg.Action {
		case "kill":
			childproc.Kill()
		case "stop":
			childproc.Stop()
		}
	})
	e, err := workflow.New(pool, &workflow.Config{Lease: cfg.Lease, Hooks: pts.Hooks(workflow.Hooks{}), ClaimWithFirstStatement: cfg.Shape.FoldedClaim})
	if err != nil {
		childproc.Fail("engine", err)
	}
	var side *sideRun
	if cfg.Side != nil {
		if side, err = openSide(ctx, *cfg.Side); err != nil {
			childproc.Fail("side channels", err)
		}
	}
	if err := registerFlows(e, cfg.ProviderURL, &http.Client{Timeout: 10 * time.Second}, nil, side, cfg.Shape); err != nil {
		childproc.Fail("register", err)
	}
	switch cfg.Mode {
	case "do":
		for _, req := range cfg.Requests {
			res, err := e.Do(ctx, req)
			a := fromDo(res, err, "child")
			childproc.Emit(childLine{Event: "answer", Key: req.Key, Answer: &a})
		}
	case "sweep":
		var total workflow.SweepStats
		for {
			st, err := e.Sweep(ctx, &workflow.SweeperConfig{Grace: -1})
			if err != nil {
				childproc.Fail("pass", err)
			}
			total.Taken += st.Taken
			total.Finished += st.Finished
			total.Released += st.Released
			total.LeaseLost += st.LeaseLost
			total.DeadLettered += st.DeadLettered
			total.GivenBack += st.GivenBack
			if st.Taken == 0 {
				break
			}
		}
		childproc.Emit(childLine{Event: "stats", Stats: &total})
	default:
		childproc.Fail("mode", errors.New(cfg.Mode))
	}
	childproc.Emit(childLine{Event: "done", Ran: ran.n.Load()})
	pool.Close()
}

// child is a running child process.
type child struct{ *childproc.Child }

// childApp is the application_name of the sessions of the env's children.
func (e *env) childApp() string { return e.appName + "_child" }

// startChild starts a child with cfg (the env's database and provider filled in).
func (e *env) startChild(t testing.TB, cfg childConfig) *child {
	t.Helper()
	if cfg.DBURL == "" {
		cfg.DBURL = e.db.URL
	}
	cfg.ProviderURL = e.provider.URL
	cfg.AppName = e.childApp()
	cfg.Shape = e.shape
	if e.side != nil {
		cfg.Side = &e.side.cfg
	}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	return &child{childproc.Start(t, "^$", childproc.Program("reliability"), envChild+"="+string(raw))}
}

func decodeLines(raw [][]byte) []childLine {
	var out []childLine
	for _, r := range raw {
		var l childLine
		if json.Unmarshal(r, &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// killed waits for the child and reports whether it was SIGKILLed (it kills itself
// only at its point) and what it answered before.
func (c *child) killed(t testing.TB) (bool, []childLine) {
	t.Helper()
	killed, raw := c.Killed(t)
	return killed, decodeLines(raw)
}

// paused waits until the child reports it reached its point and has stopped itself.
func (c *child) paused(t testing.TB) {
	t.Helper()
	var l childLine
	c.Next(t, 2*time.Minute, &l)
	require.Equal(t, "fired", l.Event, "stderr:\n%s", c.Stderr())
	c.Paused(t)
}

// resume continues a paused child and returns what it printed until it exited cleanly.
func (c *child) resume(t testing.TB) []childLine {
	t.Helper()
	return decodeLines(c.Resume(t))
}

// recordChildAnswers records the answers a child printed.
func (e *env) recordChildAnswers(scope string, lines []childLine) {
	for _, l := range lines {
		if l.Event == "answer" && l.Answer != nil {
			e.answers.record(scope, l.Key, *l.Answer)
		}
	}
}
