package matrix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/phases"
)

// The flows of the shapes. Every tx phase inserts one effect row (scope, key, phase
// and the key row's identity) into m_effects, which has no unique constraint, so that
// a second effect shows as a second row; every call posts to the fake remote under
// its derived key. Every step of the user's code first passes the race's hold.

// effectsSQL creates the effect table in schema %s.
const effectsSQL = `CREATE TABLE %s.m_effects (
	id     bigserial PRIMARY KEY,
	scope  text NOT NULL,
	key    text NOT NULL,
	phase  text NOT NULL,
	row_id text NOT NULL
)`

// deps are what the flows' functions use; a nil deps builds a flow only to read its
// phases.
type deps struct {
	insert string // the effect insert, schema-qualified: pgbouncer refuses a search_path
	hold   *hold
	remote string // the fake remote's URL
	ctx    context.Context
}

// shapeFlow is the flow of a shape (for shapeMiddleware, idemhttp registers its own).
func shapeFlow(s shape, d *deps) phases.Flow {
	switch s {
	case shapeTx:
		return phases.Flow{Name: "m_tx", Phases: []phases.Phase{
			phases.Tx("debit", d.txEffect(false)), phases.Call("charge", d.charge), phases.Tx("finish", d.txEffect(true)),
		}}
	case shapePipelined:
		return phases.Flow{Name: "m_pipelined", Phases: []phases.Phase{
			phases.Pipelined("debit", d.pipeEffect(false, true)), phases.Call("charge", d.charge), phases.Pipelined("finish", d.pipeEffect(true, true)),
		}}
	case shapeImplicit:
		return phases.Flow{Name: "m_implicit", Phases: []phases.Phase{
			phases.Pipelined("debit", d.pipeEffect(false, false)), phases.Call("charge", d.charge), phases.Pipelined("finish", d.pipeEffect(true, false)),
		}}
	case shapeCallFirst:
		return phases.Flow{Name: "m_callfirst", Phases: []phases.Phase{
			phases.Call("charge", d.charge), phases.Tx("record", d.txEffect(true)),
		}}
	case shapeAlone:
		return phases.Flow{Name: "m_alone", Phases: []phases.Phase{phases.Tx("debit", d.declined)}}
	}
	return phases.Flow{Name: "m_prime", Phases: []phases.Phase{phases.Tx("prime", primePhase)}}
}

// expectedEffects is, per phase, how many effect rows a finished key of the shape
// holds: one per tx phase that committed; none for an answer stored alone (its
// phase rolled back). The middleware's handler writes outside any transaction of the
// engine: it runs again after a crash between its end and the stored answer, as its
// contract says (idemhttp.Middleware).
func expectedEffects(c cell) map[string]int {
	switch c.shape {
	case shapeTx, shapePipelined, shapeImplicit:
		return map[string]int{"debit": 1, "finish": 1}
	case shapeCallFirst:
		return map[string]int{"record": 1}
	case shapeMiddleware:
		if c.crash == middlewarePhaseID+"/after-call" {
			return map[string]int{middlewarePhaseID: 2}
		}
		return map[string]int{middlewarePhaseID: 1}
	}
	return map[string]int{}
}

// hasCharge reports whether the shape's flow calls the remote.
func hasCharge(s shape) bool {
	return s == shapeTx || s == shapePipelined || s == shapeImplicit || s == shapeCallFirst
}

// statusOf is the status of the shape's final answer.
func statusOf(s shape) int {
	if s == shapeAlone {
		return http.StatusPaymentRequired
	}
	return http.StatusCreated
}

// answerBody is every final answer's body: the key and the request's body, so that a
// replay of another request's answer shows.
func answerBody(key string, body []byte) []byte {
	b, _ := json.Marshal(map[string]string{"key": key, "body": string(body)})
	return b
}

func primePhase(context.Context, phases.DBTX, *phases.Run) (*phases.Response, error) {
	return phases.JSON(http.StatusOK, "primed")
}

func (d *deps) txEffect(respond bool) phases.TxFunc {
	return func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		if _, err := tx.Exec(ctx, d.insert, run.Scope(), run.Key(), run.Phase(), run.ID()); err != nil {
			return nil, err
		}
		if err := d.hold.enter(ctx, run.Key()); err != nil {
			return nil, err
		}
		if !respond {
			return nil, nil
		}
		return &phases.Response{Status: http.StatusCreated, Header: jsonHeader(), Body: answerBody(run.Key(), run.Body())}, nil
	}
}

// pipeEffect queues the effect insert. With read, the phase reads the insert's result
// (and holds the winner there, its transaction open): two round trips, the first
// opened by BEGIN. Without, the phase is one round trip, an implicit transaction of
// the claim or fence, the insert and the key row's write; the winner is then held in
// the next step of the user's code it reaches.
func (d *deps) pipeEffect(respond, read bool) phases.PipelineFunc {
	return func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		if !read {
			p.Queue(d.insert, run.Scope(), run.Key(), run.Phase(), run.ID())
		} else {
			p.Queue(d.insert+` RETURNING id`, run.Scope(), run.Key(), run.Phase(), run.ID()).QueryRow(func(row pgx.Row) error {
				var id int64
				if err := row.Scan(&id); err != nil {
					return err
				}
				return d.hold.enter(d.ctx, run.Key())
			})
		}
		if !respond {
			return nil, nil
		}
		return &phases.Response{Status: http.StatusCreated, Header: jsonHeader(), Body: answerBody(run.Key(), run.Body())}, nil
	}
}

// declined writes its effect, then answers 402 with phases.Fail: the phase rolls
// back and the answer is stored alone.
func (d *deps) declined(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
	if _, err := tx.Exec(ctx, d.insert, run.Scope(), run.Key(), run.Phase(), run.ID()); err != nil {
		return nil, err
	}
	if err := d.hold.enter(ctx, run.Key()); err != nil {
		return nil, err
	}
	return nil, phases.Fail(&phases.Response{Status: http.StatusPaymentRequired, Header: jsonHeader(), Body: answerBody(run.Key(), run.Body())})
}

// charge posts to the fake remote under the phase's derived key, with the client's
// scope and key in the body (so that the check finds every effect made for a key).
func (d *deps) charge(ctx context.Context, run *phases.Run) (*phases.Response, error) {
	if err := d.hold.enter(ctx, run.Key()); err != nil {
		return nil, err
	}
	body, _ := json.Marshal(map[string]string{"scope": run.Scope(), "key": run.Key()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.remote+"/charge", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", run.DerivedKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("remote answered %d", resp.StatusCode)
	}
	return nil, nil
}

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

// hold holds the first attempt that reaches the user's code of the race's key while
// its gate is closed (the winner: it owns the key), and counts every other one that
// does so (a loser that ran the user's code).
type hold struct {
	key    string
	armed  atomic.Bool
	n      atomic.Int32
	inside chan struct{} // closed when the winner is held
	second chan struct{} // closed when another attempt reaches the user's code
	gate   chan struct{} // closed by open
	open   func()
	closed atomic.Bool
}

func newHold(key string) *hold {
	h := &hold{key: key, inside: make(chan struct{}), second: make(chan struct{}), gate: make(chan struct{})}
	h.open = sync.OnceFunc(func() { h.closed.Store(true); close(h.gate) })
	return h
}

// enter is called by every step of the user's code; it holds the winner until the
// gate opens, or ctx ends.
func (h *hold) enter(ctx context.Context, key string) error {
	if h == nil || key != h.key || !h.armed.Load() || h.closed.Load() {
		return nil
	}
	switch h.n.Add(1) {
	case 1:
		close(h.inside)
		select {
		case <-h.gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case 2:
		close(h.second)
	}
	return nil
}

// isInside reports whether the winner is held.
func (h *hold) isInside() bool {
	select {
	case <-h.inside:
		return !h.closed.Load()
	default:
		return false
	}
}

func quoteKey(k string) string { return `"` + strings.ReplaceAll(k, `"`, ``) + `"` }
