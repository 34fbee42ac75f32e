package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The tests in this file hold the claim to invariant 9 of DESIGN.md: an attempt that
// does not own a key runs no statement and no Go code of the user's phases, and answers
// without waiting on the owner or holding a connection while the owner works. They use
// only the public API and SQL, so they do not depend on how the claim is made.

// claimGuard bounds every wait of these tests. Answers are expected in milliseconds;
// the guard only turns an engine that makes a loser wait on the owner into a clear
// failure instead of a hang: the owner is held until the losers answered, so a loser
// that waited on it would wait for ever, and any bound catches it. It is generous,
// because it is also the deadline of the attempts' contexts, which a busy machine
// must not reach (and which admission reads: a queue expected to outlast it is shed).
const claimGuard = time.Minute

// Bodies of the claim tests: bodyB is a different request under the same key.
const (
	bodyA = `{"amount":100}`
	bodyB = `{"amount":999}`
)

// claimSchema holds the effects of the claim tests' flows. No unique constraints, on
// purpose: a duplicated effect shows up as an extra row.
const claimSchema = `
CREATE TABLE claim_effects (
	id       bigserial PRIMARY KEY,
	scope    text   NOT NULL,
	idem_key text   NOT NULL,
	n        bigint NOT NULL
);
CREATE TABLE claim_audit (
	id       bigserial PRIMARY KEY,
	scope    text NOT NULL,
	idem_key text NOT NULL
);`

func createClaimTables(t *testing.T, db *pgtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), claimSchema)
	require.NoError(t, err)
}

// hold counts the entries into one key's phase function and holds the first entrant
// inside the phase, after its first statement, until the test opens the gate.
type hold struct {
	entered atomic.Int32
	inside  chan struct{} // closed when the first entrant has run its first statement
	second  chan struct{} // closed when a second attempt enters the phase function
	gate    chan struct{} // closed by open
	open    func()        // opens the gate; idempotent
}

func newHold() *hold {
	h := &hold{inside: make(chan struct{}), second: make(chan struct{}), gate: make(chan struct{})}
	h.open = sync.OnceFunc(func() { close(h.gate) })
	return h
}

// enter records an entry into the phase function and reports whether it is the first.
func (h *hold) enter() bool {
	n := h.entered.Add(1)
	if n == 2 {
		close(h.second)
	}
	return n == 1
}

// wait holds the first entrant until the gate opens; later entrants pass.
func (h *hold) wait(ctx context.Context, first bool) error {
	if !first {
		return nil
	}
	close(h.inside)
	select {
	case <-h.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// holdFlow's one tx phase inserts an effect row (pipelined with whatever the engine
// sends first: it has arguments), then holds its first entrant until the gate opens,
// then responds 201.
func holdFlow(name string, h *hold) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("hold", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			first := h.enter()
			_, err := tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, $3)`,
				run.Scope(), run.Key(), h.entered.Load())
			if err != nil {
				return nil, err
			}
			if err := h.wait(ctx, first); err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]string{"key": run.Key(), "body": string(run.Body())})
		}),
	}}
}

// quickFlow responds at once, holding nothing.
func quickFlow(name string) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("quick", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, 0)`, run.Scope(), run.Key())
			if err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]string{"key": run.Key()})
		}),
	}}
}

func flowReq(flow, scope, key, body string) workflow.Request {
	return workflow.Request{Scope: scope, Key: key, Flow: flow, Method: "POST", Route: "/claims", Body: []byte(body)}
}

type claimAnswer struct {
	body string
	res  *workflow.Result
	err  error
}

// race sends senders concurrent attempts of one key, every third with bodyB and the
// rest with bodyA, while the first attempt to enter the phase is held inside it. The
// gate opens once every other attempt has answered (what invariant 9 requires: losers
// never wait on the owner), or as soon as a second attempt enters the phase function
// (the test has failed then; the gate opens so that everything ends), or when the
// guard runs out. It returns every answer.
func race(t *testing.T, e *workflow.Engine, flow, key string, h *hold, senders int) []claimAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), claimGuard)
	defer cancel()
	out := make(chan claimAnswer, senders)
	start := make(chan struct{})
	for i := range senders {
		body := bodyA
		if i%3 == 2 {
			body = bodyB
		}
		go func() {
			<-start
			res, err := e.Do(ctx, flowReq(flow, "acct", key, body))
			out <- claimAnswer{body: body, res: res, err: err}
		}()
	}
	close(start)
	answers := make([]claimAnswer, 0, senders)
collect:
	for len(answers) < senders-1 {
		select {
		case a := <-out:
			answers = append(answers, a)
		case <-h.second:
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	h.open()
	for len(answers) < senders {
		answers = append(answers, <-out) // every Do ends by the guard at the latest
	}
	return answers
}

// requireLoserAnswers checks the answers of one key's race: exactly one attempt ran
// and responded; every other attempt with its body got that response replayed or a
// 409, and every attempt with the other body got a 422 or a 409, never the response.
func requireLoserAnswers(t *testing.T, key string, answers []claimAnswer) claimAnswer {
	t.Helper()
	var winner claimAnswer
	fresh := 0
	for _, a := range answers {
		if a.err == nil && !a.res.Replayed {
			fresh++
			winner = a
		}
	}
	require.Equal(t, 1, fresh, "key %s: exactly one attempt runs the flow", key)
	require.Equal(t, 201, winner.res.Response.Status)
	for _, a := range answers {
		if ip, ok := isInProgress(a.err); ok {
			require.GreaterOrEqual(t, ip.RetryAfter, time.Second, "key %s: Retry-After", key)
			continue
		}
		if a.body != winner.body {
			require.ErrorIs(t, a.err, workflow.ErrMismatch,
				"key %s: a different body gets 422 or 409, never the winner's response", key)
			continue
		}
		require.NoError(t, a.err, "key %s: the winner's body gets its response, a replay or 409", key)
		require.Equal(t, winner.res.Response.Status, a.res.Response.Status)
		require.Equal(t, winner.res.Response.Body, a.res.Response.Body)
	}
	return winner
}

// requireAfterRace checks what later attempts of a raced key get: the same body a
// replay, the other body a mismatch that changes nothing.
func requireAfterRace(t *testing.T, b *bundle, e *workflow.Engine, flow, key string, winner claimAnswer) {
	t.Helper()
	ctx := context.Background()
	res, err := e.Do(ctx, flowReq(flow, "acct", key, winner.body))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, winner.res.Response.Body, res.Response.Body)
	other := bodyA
	if winner.body == bodyA {
		other = bodyB
	}
	before := keyRow(t, b.db, "acct", key)
	_, err = e.Do(ctx, flowReq(flow, "acct", key, other))
	require.ErrorIs(t, err, workflow.ErrMismatch)
	require.Equal(t, before, keyRow(t, b.db, "acct", key))
}

func countRows(t *testing.T, db *pgtest.DB, table, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+table+` WHERE scope = 'acct' AND idem_key = $1`, key).Scan(&n))
	return n
}

// TestClaimLosersRunNoUserStatement races many attempts, some with another body, on
// one key at a time, and checks that only the winner's phase ran: its Go code (entries
// into the phase function) and its statements, including effects a rollback cannot
// undo (a sequence, a write through another connection).
func TestClaimLosersRunNoUserStatement(t *testing.T) {
	t.Parallel()
	const keys, senders = 10, 33

	// The claim differs by isolation level: at READ COMMITTED it looks for the row
	// after taking the lock, above it inserts the row with the lock.
	for name, iso := range map[string]pgx.TxIsoLevel{
		"Sequence": "", "SequenceRepeatableRead": pgx.RepeatableRead, "SequenceSerializable": pgx.Serializable,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testClaimSequence(t, iso, false, keys, senders)
		})
	}
	// With Config.ClaimWithFirstStatement the READ COMMITTED claim rides with the
	// phase's first statement: losers enter the phase function but none of its
	// statements runs (the higher levels keep their own claim, checked the same way).
	for name, iso := range map[string]pgx.TxIsoLevel{
		"SequenceClaimWithFirstStatement": "", "SequenceClaimWithFirstStatementSerializable": pgx.Serializable,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testClaimSequence(t, iso, true, keys, senders)
		})
	}
	t.Run("AuditClaimWithFirstStatement", func(t *testing.T) {
		t.Parallel()
		testClaimAuditFolded(t, keys, senders)
	})

	t.Run("AuditThroughAnotherPool", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		createClaimTables(t, b.db)
		audit := b.db.NewPool(t) // autocommit, outside the phase's transaction
		holds := map[string]*hold{}
		for k := range keys {
			holds[fmt.Sprintf("k%d", k)] = newHold()
		}
		flow := phases.Flow{Name: "claim_audit", Phases: []phases.Phase{
			phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
				h := holds[run.Key()]
				first := h.enter()
				// A side effect the phase's rollback cannot undo.
				_, err := audit.Exec(ctx, `INSERT INTO claim_audit (scope, idem_key) VALUES ($1, $2)`, run.Scope(), run.Key())
				if err != nil {
					return nil, err
				}
				_, err = tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, 1)`, run.Scope(), run.Key())
				if err != nil {
					return nil, err
				}
				if err := h.wait(ctx, first); err != nil {
					return nil, err
				}
				return phases.JSON(201, map[string]any{"key": run.Key(), "body": string(run.Body())})
			}),
		}}
		require.NoError(t, b.engine.Register(flow))

		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			answers := race(t, b.engine, flow.Name, key, holds[key], senders)

			require.Equal(t, 1, countRows(t, b.db, "claim_audit", key),
				"key %s: audit rows written by the phase's Go code; losers must run none of it", key)
			require.EqualValues(t, 1, holds[key].entered.Load(), "key %s: entries into the phase function", key)
			winner := requireLoserAnswers(t, key, answers)
			require.Equal(t, 1, countRows(t, b.db, "claim_effects", key), "key %s: effect rows", key)
			requireAfterRace(t, b, b.engine, flow.Name, key, winner)
		}
	})
}

// testClaimSequence races senders attempts on each of keys keys of a flow whose first
// statement advances a sequence, in a tx phase at iso. folded runs the engine with
// Config.ClaimWithFirstStatement: then the hold counts the attempts that got past the
// phase's first statement (where the folded claim is known), not those that entered
// the phase function, and only at READ COMMITTED may losers enter it.
func testClaimSequence(t *testing.T, iso pgx.TxIsoLevel, folded bool, keys, senders int) {
	b := setup(t, setupOpts{cfg: &workflow.Config{ClaimWithFirstStatement: folded}})
	var calls atomic.Int64 // entries into the phase function
	createClaimTables(t, b.db)
	holds := map[string]*hold{}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		holds[key] = newHold()
		_, err := b.db.Pool.Exec(context.Background(), `CREATE SEQUENCE claim_seq_`+key)
		require.NoError(t, err)
	}
	// The first statement has an argument, so that an engine that pipelines the
	// phase's first statement after its own sends it along.
	reserve := phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
		h := holds[run.Key()]
		calls.Add(1)
		var first bool
		if !folded {
			first = h.enter()
		}
		var n int64
		err := tx.QueryRow(ctx, `SELECT nextval($1::text::regclass)`, "claim_seq_"+run.Key()).Scan(&n)
		if err != nil {
			return nil, err
		}
		if folded {
			first = h.enter()
		}
		if err := h.wait(ctx, first); err != nil {
			return nil, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, $3)`,
			run.Scope(), run.Key(), n)
		if err != nil {
			return nil, err
		}
		return phases.JSON(201, map[string]any{"key": run.Key(), "n": n, "body": string(run.Body())})
	})
	reserve.IsoLevel = iso
	flow := phases.Flow{Name: "claim_seq", Phases: []phases.Phase{reserve}}
	require.NoError(t, b.engine.Register(flow))

	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		answers := race(t, b.engine, flow.Name, key, holds[key], senders)

		var last int64
		var called bool
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT last_value, is_called FROM claim_seq_`+key).Scan(&last, &called))
		advanced := 0
		if called {
			advanced = int(last)
		}
		require.Equal(t, 1, advanced,
			"key %s: times the sequence advanced; only the winner may run the phase's statements", key)
		require.EqualValues(t, 1, holds[key].entered.Load(),
			"key %s: entries into the phase function (past its first statement, folded); losers must run no Go code of the phase", key)
		winner := requireLoserAnswers(t, key, answers)
		require.Equal(t, 1, countRows(t, b.db, "claim_effects", key), "key %s: effect rows", key)
		requireAfterRace(t, b, b.engine, flow.Name, key, winner)
	}
	if !folded || iso != "" {
		require.EqualValues(t, keys, calls.Load(), "entries into the phase function: the winners'")
	}
	t.Logf("entries into the phase function: %d for %d keys of %d senders", calls.Load(), keys, senders)
}

// testClaimAuditFolded is AuditThroughAnotherPool with Config.ClaimWithFirstStatement:
// the phase writes its audit row, an effect its rollback cannot undo, right after its
// first statement, which carries the folded claim. Losers may enter the phase function,
// but none gets past that statement: one audit row, one effect row per key.
func testClaimAuditFolded(t *testing.T, keys, senders int) {
	b := setup(t, setupOpts{cfg: &workflow.Config{ClaimWithFirstStatement: true}})
	createClaimTables(t, b.db)
	audit := b.db.NewPool(t) // autocommit, outside the phase's transaction
	holds := map[string]*hold{}
	for k := range keys {
		holds[fmt.Sprintf("k%d", k)] = newHold()
	}
	flow := phases.Flow{Name: "claim_audit_folded", Phases: []phases.Phase{
		phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			_, err := tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, 1)`, run.Scope(), run.Key())
			if err != nil {
				return nil, err
			}
			h := holds[run.Key()]
			first := h.enter()
			_, err = audit.Exec(ctx, `INSERT INTO claim_audit (scope, idem_key) VALUES ($1, $2)`, run.Scope(), run.Key())
			if err != nil {
				return nil, err
			}
			if err := h.wait(ctx, first); err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]any{"key": run.Key(), "body": string(run.Body())})
		}),
	}}
	require.NoError(t, b.engine.Register(flow))
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		answers := race(t, b.engine, flow.Name, key, holds[key], senders)
		require.Equal(t, 1, countRows(t, b.db, "claim_audit", key),
			"key %s: audit rows written after the phase's first statement; losers must not get past it", key)
		require.EqualValues(t, 1, holds[key].entered.Load(), "key %s: attempts past the first statement", key)
		winner := requireLoserAnswers(t, key, answers)
		require.Equal(t, 1, countRows(t, b.db, "claim_effects", key), "key %s: effect rows", key)
		requireAfterRace(t, b, b.engine, flow.Name, key, winner)
	}
}

// heldWinner starts the first attempt of req on e and waits until it is inside its
// phase, past its first statement, held by h. The returned function opens the gate
// and returns the winner's answer; cleanup opens the gate too.
func heldWinner(t *testing.T, e *workflow.Engine, h *hold, req workflow.Request) func() (*workflow.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan claimAnswer, 1)
	go func() {
		res, err := e.Do(ctx, req)
		done <- claimAnswer{res: res, err: err}
	}()
	var once sync.Once
	var a claimAnswer
	finish := func() (*workflow.Result, error) {
		once.Do(func() {
			h.open()
			a = <-done
			cancel()
		})
		return a.res, a.err
	}
	t.Cleanup(func() { _, _ = finish() })
	select {
	case <-h.inside:
	case a := <-done:
		done <- a
		t.Fatalf("the first attempt ended before it reached its phase: %v", a.err)
	case <-time.After(claimGuard):
		t.Fatalf("the first attempt did not reach its phase within %s", claimGuard)
	}
	return finish
}

// TestClaimDuplicatesDoNotWait holds the first attempt of a key inside its first
// phase, with its key row not yet committed, and checks that duplicates answer 409 at
// once, before the owner is let go, giving their connections back; that other keys are
// served meanwhile; and that the owner then finishes and is replayed.
func TestClaimDuplicatesDoNotWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createClaimTables(t, b.db)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 3 // the held owner takes one; duplicates that held theirs would run out
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := b.newEngine(t, setupOpts{pool: pool})
	h := newHold()
	require.NoError(t, e.Register(holdFlow("claim_hold", h)))
	require.NoError(t, e.Register(quickFlow("claim_quick")))
	req := flowReq("claim_hold", "acct", "held", bodyA)
	finish := heldWinner(t, e, h, req)

	const dups = 8
	dctx, cancel := context.WithTimeout(ctx, claimGuard)
	defer cancel()
	out := make(chan error, dups)
	for range dups {
		go func() {
			_, err := e.Do(dctx, req)
			out <- err
		}()
	}
	// All of them answer while the owner is still held: the gate opens only later.
	for i := range dups {
		err := <-out
		ip, ok := isInProgress(err)
		if !ok && errors.Is(err, context.DeadlineExceeded) {
			require.Failf(t, "duplicate waited on the owner",
				"duplicate %d did not answer within %s while the owner was held: %v", i, claimGuard, err)
		}
		require.True(t, ok, "duplicate %d: want *workflow.InProgressError while the owner is held, got %v", i, err)
		require.GreaterOrEqual(t, ip.RetryAfter, time.Second)
	}
	// Each duplicate gave its connection back before answering (given back, not
	// destroyed: pgxpool counts a connection being destroyed as acquired until closed).
	require.EqualValues(t, 1, pool.Stat().AcquiredConns(),
		"connections in use once the duplicates answered: only the owner's")
	require.EqualValues(t, 1, h.entered.Load(), "entries into the phase function; duplicates must run none")

	res, err := e.Do(dctx, flowReq("claim_quick", "acct_other", "other", bodyA))
	require.NoError(t, err, "another scope's key is served while the owner is held")
	require.False(t, res.Replayed)
	require.Equal(t, 201, res.Response.Status)

	won, err := finish()
	require.NoError(t, err)
	require.False(t, won.Replayed)
	require.Equal(t, 201, won.Response.Status)
	replay, err := e.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, won.Response.Body, replay.Response.Body)
	require.Equal(t, 1, countRows(t, b.db, "claim_effects", "held"))
}

// TestClaimMismatchWritesNothingWhileClaimed reuses a key with another body while its
// first attempt is held inside its first phase. The reuse answers at once with 409 or
// 422: while the owner's claim may still be uncommitted, an engine can know that the
// key is taken without seeing the owner's fingerprint (409: retry later, and the retry
// gets 422), or it may have committed the claim first and compare (422). Either way it
// writes nothing and runs nothing, and once the owner finished the reuse gets 422.
func TestClaimMismatchWritesNothingWhileClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createClaimTables(t, b.db)
	h := newHold()
	require.NoError(t, b.engine.Register(holdFlow("claim_hold", h)))
	finish := heldWinner(t, b.engine, h, flowReq("claim_hold", "acct", "k", bodyA))

	mismatch := flowReq("claim_hold", "acct", "k", bodyB)
	before := keyRow(t, b.db, "acct", "k")
	mctx, cancel := context.WithTimeout(ctx, claimGuard)
	defer cancel()
	_, err := b.engine.Do(mctx, mismatch)
	if errors.Is(err, context.DeadlineExceeded) {
		require.Failf(t, "mismatched reuse waited on the owner",
			"no answer within %s while the owner was held: %v", claimGuard, err)
	}
	if ip, ok := isInProgress(err); ok {
		require.GreaterOrEqual(t, ip.RetryAfter, time.Second)
	} else {
		require.ErrorIs(t, err, workflow.ErrMismatch, "while the owner is held: want 409 or 422")
	}
	require.Equal(t, before, keyRow(t, b.db, "acct", "k"), "the reuse changed the key row")
	require.EqualValues(t, 1, h.entered.Load(), "entries into the phase function; the reuse must run none")

	won, err := finish()
	require.NoError(t, err)
	require.Equal(t, 201, won.Response.Status)
	finished := keyRow(t, b.db, "acct", "k")
	_, err = b.engine.Do(ctx, mismatch)
	require.ErrorIs(t, err, workflow.ErrMismatch)
	require.Equal(t, finished, keyRow(t, b.db, "acct", "k"))
	replay, err := b.engine.Do(ctx, flowReq("claim_hold", "acct", "k", bodyA))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, won.Response.Body, replay.Response.Body)
	require.Equal(t, 1, countRows(t, b.db, "claim_effects", "k"))
}

// TestClaimLockIsPerKeyTable holds a key's claim in one schema's key table and claims
// the same scope and key in another schema's: the claim locks of the two tables are
// apart, so the second is not turned away.
func TestClaimLockIsPerKeyTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, other := setup(t, setupOpts{}), setup(t, setupOpts{})
	createClaimTables(t, a.db)
	createClaimTables(t, other.db)
	h := newHold()
	require.NoError(t, a.engine.Register(holdFlow("claim_hold", h)))
	require.NoError(t, other.engine.Register(quickFlow("claim_quick")))
	finish := heldWinner(t, a.engine, h, flowReq("claim_hold", "acct", "same", bodyA))

	res, err := other.engine.Do(ctx, flowReq("claim_quick", "acct", "same", bodyA))
	require.NoError(t, err, "the same key in another key table is another key")
	require.Equal(t, 201, res.Response.Status)
	require.False(t, res.Replayed)

	res, err = finish()
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
}

// TestClaimHeldHookClaimWithFirstStatement: with the claim folded into the first
// statement's round trip (Config.ClaimWithFirstStatement), ClaimHeld fires once, inside
// that statement's call: after the phase function started, before the statement's
// result reached it, with nothing of the key committed. A first phase that sends no
// statement claims with its commit: no ClaimHeld, and the key is claimed all the same.
func TestClaimHeldHookClaimWithFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var held, keysAtHold atomic.Int32
	var started, answered atomic.Bool
	var b *bundle
	b = setup(t, setupOpts{cfg: &workflow.Config{ClaimWithFirstStatement: true, Hooks: workflow.Hooks{
		ClaimHeld: func(context.Context, workflow.PhaseEvent) {
			held.Add(1)
			keysAtHold.Store(int32(countKeys(t, b.db)))
			require.True(t, started.Load(), "the folded claim is held once the phase function sent its first statement")
			require.False(t, answered.Load(), "the statement's result reached the phase before the claim was held")
		},
	}}})
	createClaimTables(t, b.db)
	flow := phases.Flow{Name: "claim_held_folded", Phases: []phases.Phase{
		phases.Tx("reserve", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			started.Store(true)
			_, err := tx.Exec(ctx, `INSERT INTO claim_effects (scope, idem_key, n) VALUES ($1, $2, 1)`, run.Scope(), run.Key())
			answered.Store(err == nil)
			if err != nil {
				return nil, err
			}
			return phases.JSON(201, map[string]string{"key": run.Key()})
		}),
	}}
	require.NoError(t, b.engine.Register(flow))
	require.NoError(t, b.engine.Register(quickFlowNoStatement("claim_held_folded_none")))

	res, err := b.engine.Do(ctx, flowReq(flow.Name, "acct", "k", bodyA))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.EqualValues(t, 1, held.Load())
	require.Zero(t, keysAtHold.Load(), "nothing of the key was committed at the hook")
	res, err = b.engine.Do(ctx, flowReq(flow.Name, "acct", "k", bodyA))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.EqualValues(t, 1, held.Load(), "a replay holds no claim")

	res, err = b.engine.Do(ctx, flowReq("claim_held_folded_none", "acct", "none", bodyA))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	res, err = b.engine.Do(ctx, flowReq("claim_held_folded_none", "acct", "none", bodyA))
	require.NoError(t, err)
	require.True(t, res.Replayed, "a phase that sends no statement claims with its commit")
	require.EqualValues(t, 1, held.Load(), "no ClaimHeld for a claim that rides with the commit")
}

// quickFlowNoStatement responds at once and sends no statement.
func quickFlowNoStatement(name string) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Tx("quick", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			return phases.JSON(201, map[string]string{"key": run.Key()})
		}),
	}}
}
