package workflow_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/workflow"
)

// The tests in this file end a pipelined phase's one-round-trip implicit transaction
// between its sending and its answer: the connection is cut once the server answered
// (it committed, the client never learns it), or the process is killed (SIGKILL) right
// after the batch was written, or once the server answered. The engine, or the retry
// after the crash, must settle the key with one effect.

// readyIdle is the ReadyForQuery message that ends a batch outside any transaction
// block: the server committed the implicit transaction (or rolled it back, having
// answered an error first).
var readyIdle = []byte{'Z', 0, 0, 0, 5, 'I'}

// flushMsg is the protocol's Flush message. A batch whose claim goes first on a
// connection that has not prepared its statements (pgpipe.SendGuarded) ends its first
// write with it: the claim, the key row's insert and the statements' Parse. The rest,
// which ends the implicit transaction, is the next write.
var flushMsg = []byte{'H', 0, 0, 0, 4}

// cutter wraps a pool's connections. Once armed, the next write that carries the
// request's route (the key row's insert: pipeFlow's reserve batch, in every query exec
// mode) goes through, and the next one too if it ended with a Flush; then, at the
// write's return or (answered) once the server's whole answer arrived (read, not
// handed to pgx), cut runs.
type cutter struct {
	armed    atomic.Bool
	answered bool // cut once the server answered, rather than once the batch was sent
	// atFlush: cut right after a first write that ended with a Flush (the claim, the
	// key row's insert and the statements' Parse sent, the rest not).
	atFlush bool
	cut     func(net.Conn)
	cuts    atomic.Int32
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

type cutConn struct {
	net.Conn
	c *cutter
	// cutting: the batch is being sent or was sent, and its answer is to be cut. Set
	// before the write, and read by Read after its own read too: when a write is slow
	// (over 15 ms, as on a busy machine), pgconn reads in the background while it
	// writes, so a Read that began before the batch's write can return its answer.
	cutting atomic.Bool
	flushed bool // the batch's first write ended with a Flush: the next one ends it
}

func (cc *cutConn) Write(p []byte) (int, error) {
	target := cc.flushed || bytes.Contains(p, []byte("/pipe")) && cc.c.armed.CompareAndSwap(true, false)
	if target {
		// A first write that ends with a Flush (the claim first, pgpipe.SendGuarded) is
		// let through unless atFlush: its guard's answer must reach pgx, and the next
		// write ends the transaction.
		if cc.flushed = bytes.HasSuffix(p, flushMsg); cc.flushed && !cc.c.atFlush {
			return cc.Conn.Write(p)
		}
		if cc.c.answered {
			cc.cutting.Store(true)
		}
	}
	n, err := cc.Conn.Write(p)
	if target && err == nil && !cc.c.answered {
		cc.c.cuts.Add(1)
		cc.c.cut(cc.Conn)
	}
	return n, err
}

func (cc *cutConn) Read(p []byte) (int, error) {
	if !cc.cutting.Load() {
		n, err := cc.Conn.Read(p)
		if n == 0 || !cc.cutting.Load() {
			return n, err
		}
		// The batch was written while this read waited: what it read is the start of
		// the batch's answer (the connection was idle before the batch).
		return cc.cutAnswer(append([]byte(nil), p[:n]...), err)
	}
	return cc.cutAnswer(nil, nil)
}

// cutAnswer reads the rest of the batch's answer after got (unless reading already
// failed), then cuts, handing pgx nothing of it.
func (cc *cutConn) cutAnswer(got []byte, err error) (int, error) {
	buf := make([]byte, 4096)
	for err == nil && !bytes.HasSuffix(got, readyIdle) {
		var n int
		n, err = cc.Conn.Read(buf)
		got = append(got, buf[:n]...)
	}
	cc.cutting.Store(false)
	cc.c.cuts.Add(1)
	cc.c.cut(cc.Conn)
	return 0, io.EOF // as when the server's side closes
}

// closeConn is a cut that closes the connection.
func closeConn(c net.Conn) { _ = c.Close() }

// TestPipelinedLostAnswer: reserve's implicit transaction commits, and the connection
// dies before its answer reaches the engine. The engine reads the key row, learns
// the commit happened, and goes on: the first attempt answers, with one effect.
func TestPipelinedLostAnswer(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := pipeSetup(t, mode, "")
			cut := &cutter{answered: true, cut: closeConn}
			cfg, err := pgxpool.ParseConfig(b.db.URL)
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.DialFunc = cut.dial
			cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the cutter reads plain protocol
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			e, err := workflow.New(pool, nil)
			require.NoError(t, err)
			require.NoError(t, workflow.StartUp(context.Background(), e))
			require.NoError(t, e.Register(pipeFlow("pipe", &b.calls, nil)))
			cut.armed.Store(true)
			res, err := e.Do(context.Background(), pipeReq("lost", `{"a":1}`))
			require.NoError(t, err)
			require.EqualValues(t, 1, cut.cuts.Load(), "reserve's answer was lost")
			require.Equal(t, http.StatusCreated, res.Response.Status)
			require.JSONEq(t, `{"key":"lost","sum":14}`, string(res.Response.Body))
			require.EqualValues(t, 2, seqRuns(t, b.db), "reserve and settle, each run once")
		})
	}
}

// The child program "pipecut": pipeFlow's request on a pool in query exec mode
// envPipeCutMode whose connection (cutter) kills the process (SIGKILL) right after
// reserve's batch was written (envPipeCutPoint empty), once the server answered it
// ("answered"), or, on a connection that has not prepared reserve's statements, right
// after its first part was written: the claim, the key row's insert and the Parse of
// the statements, behind a Flush ("guard").
const (
	envPipeCutDB    = "IDEMFLOW_PIPE_CUT_DB"
	envPipeCutPoint = "IDEMFLOW_PIPE_CUT_POINT"
	envPipeCutMode  = "IDEMFLOW_PIPE_CUT_MODE"
	pipeCutApp      = "idemflow_pipe_cut"
)

func init() {
	childproc.Register("pipecut", func() {
		ctx := context.Background()
		point := os.Getenv(envPipeCutPoint)
		cut := &cutter{answered: point == "answered", atFlush: point == "guard", cut: func(net.Conn) { childproc.Kill() }}
		cfg, err := pgxpool.ParseConfig(os.Getenv(envPipeCutDB))
		if err != nil {
			childproc.Fail("config", err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		if os.Getenv(envPipeCutMode) != "" {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = pipeCutApp
		cfg.ConnConfig.DialFunc = cut.dial
		cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the cutter reads plain protocol
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			childproc.Fail("connect", err)
		}
		e, err := workflow.New(pool, nil)
		if err != nil {
			childproc.Fail("engine", err)
		}
		var calls atomic.Int32
		if err := e.Register(pipeFlow("pipe", &calls, nil)); err != nil {
			childproc.Fail("register", err)
		}
		cut.armed.Store(true)
		_, err = e.Do(ctx, pipeReq("cut", `{"a":1}`))
		childproc.Fail("not killed", err)
	})
}

// TestPipelinedKilledInImplicitCommit kills a real process (SIGKILL) right after it
// wrote reserve's one-round-trip implicit transaction, and once the server answered
// it; a retry (after the lease ran out, if the key row committed) finishes the key
// with one reserve and one settle. In pgx's exec mode, and in its default mode on a
// connection that has not prepared reserve's statements, whose claim goes first
// behind a Flush: killed there ("Guard"), the server rolls the claim back.
func TestPipelinedKilledInImplicitCommit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, point, cold string }{
		{"Sent", "", ""}, {"SentAnswered", "answered", ""},
		{"ColdGuard", "guard", "cold"}, {"ColdSent", "", "cold"}, {"ColdSentAnswered", "answered", "cold"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := pipeSetup(t, pgx.QueryExecModeExec, "")
			child := childproc.Start(t, "^$", childproc.Program("pipecut"),
				envPipeCutDB+"="+b.db.URL, envPipeCutPoint+"="+c.point, envPipeCutMode+"="+c.cold)
			killed, _ := child.Killed(t)
			require.True(t, killed, "stderr: %s", child.Stderr())
			childproc.WaitSessionsGone(t, b.db.Pool, pipeCutApp)
			rows := countKeysOf(t, b, "cut")
			switch c.point {
			case "answered":
				require.Equal(t, 1, rows, "the server committed reserve before the process died")
			case "guard":
				require.Equal(t, 0, rows, "no Sync was sent: the server rolled the claim back")
				require.EqualValues(t, 0, seqRuns(t, b.db), "none of reserve's statements ran")
			}
			t.Logf("key row committed before the kill: %v", rows == 1)
			if rows == 1 {
				expireLease(t, b.db, "acct", "cut")
			}
			res, err := b.engine.Do(ctx, pipeReq("cut", `{"a":1}`))
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, res.Response.Status)
			require.JSONEq(t, `{"key":"cut","sum":14}`, string(res.Response.Body))
			var reserve, settle int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE phase = 'reserve'),
				count(*) FILTER (WHERE phase = 'settle') FROM pipe_effects WHERE idem_key = 'cut'`).Scan(&reserve, &settle))
			require.Equal(t, [2]int{1, 1}, [2]int{reserve, settle}, "effects of the key")
		})
	}
}
