package matrix

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
)

// Senders of each stage of the race.
const (
	sendersA = 6 // every third with bodyB
	sendersB = 4
)

// runCell runs one cell:
//
//  1. engines: A (the first stage of the race), B (the second: another process's
//     engine, its connections as cold or warm as the cell says) and, with a crash
//     point, C (the abandoned attempt); with layoutUnlearnt each one's start-up check
//     has its connection cut; when warm, each pool is warmed with fresh keys.
//  2. crash: an attempt of the race's key is abandoned at the crash point on C, and
//     a lease it left is moved past by the database clock.
//  3. stage A, the claim (or take-over) race through A, in steps (see stageA): every
//     look-up first, then the claims in three groups (a leader, early losers while
//     the leader holds the claim lock, late losers after its claim), held by a claim
//     barrier in A's tracer and a trigger gate on the key table's inserts (gateSQL).
//     The winner is held in the first step of the user's code it reaches.
//  4. stage B, late losers: the test takes ACCESS EXCLUSIVE on the effect table
//     (granted, or queued behind the winner's lock), and sends more attempts through
//     B: an attempt that sends any of the user's statements, even a Parse, waits in
//     that lock's queue, and the detector sees it.
//  5. the gate opens, the winner finishes; then the checks.
//
// Throughout, a detector polls pg_stat_activity: an attempt of the cell waiting on a
// lock held by the test's lock or by a session idle in a transaction (the held
// winner) is a loser that waits; a second attempt in the user's code is a loser that
// ran it.
func runCell(t *testing.T, c cell) {
	r := newRig(t, c)
	var crashE *engineOn
	if c.crash != crashNone {
		crashE = r.newEngine("c")
	}
	a, b := r.newEngine("a"), r.newEngine("b")
	if c.warm {
		r.warm(a)
		r.warm(b)
	}
	if crashE != nil {
		r.crash(crashE)
	}
	r.deps.hold.armed.Store(true)
	out := make(chan answer, sendersA+sendersB)
	var v violations
	r.stageA(a, out, &v)
	r.stageB(b, out, &v)
	r.deps.hold.open()
	answers := make([]answer, 0, sendersA+sendersB)
	for range sendersA + sendersB {
		answers = append(answers, <-out) // every attempt ends by the guard
	}
	select {
	case <-r.deps.hold.second:
		v.add("a second attempt ran the user's code while the winner held the key")
	default:
	}
	for _, msg := range v.list {
		t.Errorf("%s", msg)
	}
	r.check(a, answers)
}

// violations collects what the detector and the stages saw.
type violations struct{ list []string }

func (v *violations) add(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	for _, m := range v.list {
		if m == msg {
			return
		}
	}
	v.list = append(v.list, msg)
}

// locker is a transaction of the test's that holds (or waits for) a table lock.
type locker struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	pid  int32
	done chan error // the LOCK statement's end
	once sync.Once
}

// lockTable starts `LOCK TABLE table IN mode MODE` in a transaction of its own; it
// may wait (queued behind another lock), so it returns once the lock is granted or
// queued, as pg_locks shows.
func (r *rig) lockTable(table, mode string) *locker {
	qualified := pgx.Identifier{r.db.Schema, table}.Sanitize()
	return r.lock(fmt.Sprintf("the test's %s lock on %s, granted or queued", mode, table),
		`LOCK TABLE `+qualified+` IN `+mode+` MODE`,
		`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND relation = '`+qualified+`'::regclass)`)
}

// lockKeyInserts takes the advisory lock that the cell's trigger on the key table
// (gateSQL) waits for: every insert of a key row stops in the trigger, after its
// statement's snapshot and checks, until the lock goes.
func (r *rig) lockKeyInserts() *locker {
	return r.lock("the test's lock on inserts of key rows", fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d, %d)`, gateClass, r.gate),
		`SELECT true WHERE $1 > 0`)
}

// lock runs statement in a transaction of its own, in the background (it may wait),
// and returns once probe (given the locker's backend) says the lock is granted or
// queued.
func (r *rig) lock(what, statement, probe string) *locker {
	t := r.t
	t.Helper()
	conn, err := r.db.Pool.Acquire(r.ctx)
	require.NoError(t, err)
	tx, err := conn.Begin(r.ctx)
	require.NoError(t, err)
	l := &locker{conn: conn, tx: tx, done: make(chan error, 1)}
	require.NoError(t, tx.QueryRow(r.ctx, `SELECT pg_backend_pid()`).Scan(&l.pid))
	go func() {
		_, err := tx.Exec(r.ctx, statement)
		l.done <- err
	}()
	r.waitFor(what, func() bool {
		var in bool
		require.NoError(t, r.db.Pool.QueryRow(r.ctx, probe, l.pid).Scan(&in))
		return in
	})
	return l
}

// release ends the locker's transaction, granted or still waiting; it is idempotent.
func (l *locker) release(t *testing.T) {
	t.Helper()
	l.once.Do(func() {
		_ = l.conn.Conn().PgConn().CancelRequest(context.Background()) // a LOCK still waiting ends
		if err := <-l.done; err != nil && !strings.Contains(err.Error(), "canceling statement") {
			t.Errorf("the test's lock: %v", err)
		}
		_ = l.tx.Rollback(context.Background())
		l.conn.Release()
	})
}

// waitFor polls cond (database state) until it holds, failing t after the guard.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("gave up waiting for %s after %s", what, guard)
		}
		pollPause()
	}
}

// pollPause is the pause between two polls of the database's state: polling is how
// the test watches the server (its locks and sessions), not a synchronisation.
func pollPause() { time.Sleep(2 * time.Millisecond) }

// waiter is a session of the cell's engines waiting on a lock.
type waiter struct {
	query    string
	blockers []int32 // pg_blocking_pids
	byIdle   bool    // a session idle in a transaction (not the test's) is one of its blockers
}

// waiters reads the sessions of the cell's engines waiting on a lock, and what blocks
// them; tests are the test's own sessions.
func (r *rig) waiters(tests []int32) []waiter {
	rows, err := r.db.Pool.Query(r.ctx, `
SELECT left(a.query, 200), pg_blocking_pids(a.pid),
	EXISTS (SELECT 1 FROM pg_stat_activity o WHERE o.pid = ANY (pg_blocking_pids(a.pid)) AND NOT o.pid = ANY ($2) AND o.state LIKE 'idle in transaction%')
FROM pg_stat_activity a
WHERE a.wait_event_type = 'Lock' AND a.application_name = $1 AND NOT a.pid = ANY ($2)`, r.app, tests)
	require.NoError(r.t, err)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (waiter, error) {
		var w waiter
		return w, row.Scan(&w.query, &w.blockers, &w.byIdle)
	})
	require.NoError(r.t, err)
	return out
}

// observe reads the cell's sessions waiting on a lock once. A session blocked by one
// idle in a transaction (the held winner) waits on the key's owner; one blocked by
// stop (a lock of the test's meant to stop it; nil for none) is counted; one blocked by
// a lock of forbid's is reported as what forbid says.
func (r *rig) observe(stop *locker, forbid map[*locker]string, v *violations) (stopped int) {
	tests := []int32{} // not nil: pgx sends a nil slice as NULL, and NOT pid = ANY (NULL) is never true
	if stop != nil {
		tests = append(tests, stop.pid)
	}
	for l := range forbid {
		tests = append(tests, l.pid)
	}
	for _, w := range r.waiters(tests) {
		if w.byIdle {
			v.add("an attempt waits on a lock held by the key's owner: %s", w.query)
		}
		for l, what := range forbid {
			if slices.Contains(w.blockers, l.pid) {
				v.add("%s: %s", what, w.query)
			}
		}
		if stop != nil && slices.Contains(w.blockers, stop.pid) {
			stopped++
		}
	}
	return stopped
}

// stageA is the claim (or take-over) race on engine a, in steps, each entered when
// the database and the barrier show the previous one settled:
//
//  1. every sender has made its look-up: it answered, or its claim is held by the
//     barrier (or it is held in the user's code, having taken the key over);
//  2. the first claim goes (the leader), while the test holds the lock that the key
//     table's trigger waits for: it stops in its insert of the key row holding the
//     claim lock (or, in a Go-code phase, is held in the user's code);
//  3. the test takes ACCESS EXCLUSIVE on the effect table, and the rest of the early
//     half claim: each must answer at once, and one that sends a statement on the
//     user's table, even its Parse, waits in that lock's queue;
//  4. both locks go: the winner's claim commits, or it is held in the user's code;
//  5. the late half claims, after the winner, with look-ups older than its claim.
func (r *rig) stageA(a *engineOn, out chan<- answer, v *violations) {
	t := r.t
	gate := r.lockKeyInserts()
	var effects *locker
	a.bar.activate(sendersA / 2)
	defer a.bar.stop()
	got := make(chan answer, sendersA)
	for i := range sendersA {
		body := bodyA
		if i%3 == 2 {
			body = bodyB
		}
		go func() { got <- r.send(a, body) }()
	}
	var answered []answer
	defer func() { // the rest (the winner's) answer once the gate opens
		go func() {
			for range sendersA - len(answered) {
				out <- <-got
			}
		}()
		if effects != nil {
			effects.release(t)
		}
		gate.release(t)
	}()
	step := 1
	deadline := time.Now().Add(guard)
	for {
		answered = drain(got, out, answered)
		forbid := map[*locker]string{}
		if effects != nil && step == 3 {
			forbid[effects] = "stage A: a loser sent a statement on the user's table (it waits in the queue of the test's lock)"
		}
		if step > 4 {
			forbid[gate] = "stage A: an attempt waits on the test's lock after it went"
		}
		stopped := r.observe(gate, forbid, v)
		inside := 0
		if r.deps.hold.isInside() {
			inside = 1
		}
		arrived, late := a.bar.held()
		n := len(answered) + inside
		switch {
		case len(v.list) > 0:
			return
		case step == 1 && n+arrived >= sendersA:
			a.bar.releaseLeader()
			step = 2
		case step == 2 && (stopped+inside > 0 || n+late+max(0, arrived-late-1) >= sendersA):
			effects = r.lockTable("m_effects", "ACCESS EXCLUSIVE")
			a.bar.releaseEarly()
			step = 3
		case step == 3 && n+stopped+late >= sendersA:
			effects.release(t)
			gate.release(t)
			step = 4
		case step == 4 && (inside == 1 || n >= sendersA || r.rowVisible()):
			a.bar.releaseLate()
			step = 5
		case step == 5 && n >= sendersA:
			return
		}
		if time.Now().After(deadline) {
			v.add("stage A: stuck at step %d after %s: %d of %d attempts answered, winner held: %v, claims held: %d", step, guard, len(answered), sendersA, inside == 1, arrived)
			return
		}
		pollPause()
	}
}

// drain moves every answer got holds to out, and appends it to answered.
func drain(got <-chan answer, out chan<- answer, answered []answer) []answer {
	for {
		select {
		case x := <-got:
			out <- x
			answered = append(answered, x)
		default:
			return answered
		}
	}
}

// rowVisible reports whether the race's key has a committed row.
func (r *rig) rowVisible() bool {
	var ok bool
	require.NoError(r.t, r.db.Pool.QueryRow(r.ctx, `SELECT EXISTS (SELECT 1 FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1)`, r.key).Scan(&ok))
	return ok
}

// stageB sends late losers through engine b while the winner is held (if any) and the
// test's ACCESS EXCLUSIVE lock on the effect table is granted or queued.
func (r *rig) stageB(b *engineOn, out chan<- answer, v *violations) {
	t := r.t
	l := r.lockTable("m_effects", "ACCESS EXCLUSIVE")
	defer l.release(t)
	got := make(chan answer, sendersB)
	for i := range sendersB {
		body := bodyA
		if i%2 == 1 {
			body = bodyB
		}
		go func() { got <- r.send(b, body) }()
	}
	n := 0
	deadline := time.Now().Add(guard)
	for n < sendersB {
		select {
		case x := <-got:
			n++
			out <- x
			continue
		default:
		}
		r.observe(nil, map[*locker]string{l: "stage B: a loser sent a statement on the user's table (it waits in the queue of the test's lock)"}, v)
		if len(v.list) > 0 {
			go func() { // the rest answer once the locks go
				for ; n < sendersB; n++ {
					out <- <-got
				}
			}()
			return
		}
		if time.Now().After(deadline) {
			v.add("stage B: after %s, %d of %d late attempts answered", guard, n, sendersB)
			go func() {
				for ; n < sendersB; n++ {
					out <- <-got
				}
			}()
			return
		}
		pollPause()
	}
}

// check holds the key to the cell's guarantees once every attempt has answered.
func (r *rig) check(a *engineOn, answers []answer) {
	t := r.t
	t.Helper()
	var fresh []answer
	classes := map[string]int{}
	for _, x := range answers {
		classes[x.class()]++
	}
	t.Logf("answers: %v", classes)
	for _, x := range answers {
		switch cls := x.class(); cls {
		case "fresh":
			fresh = append(fresh, x)
			fallthrough
		case "replay":
			r.checkBody(x)
		case "409", "422":
		default:
			t.Errorf("an attempt got an answer no contract documents: %s", x)
		}
	}
	if len(fresh) > 1 {
		t.Errorf("%d attempts ran the flow to a fresh answer: %v", len(fresh), fresh)
	}
	var rows int
	require.NoError(t, r.db.Pool.QueryRow(r.ctx, `SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, r.key).Scan(&rows))
	if rows != 1 {
		t.Fatalf("%d key rows for one key", rows)
	}
	k := idemflowtest.RequireFinished(t, r.db.Pool, "acct", r.key)
	if k.ResponseStatus != statusOf(r.c.shape) {
		t.Errorf("stored status %d, want %d", k.ResponseStatus, statusOf(r.c.shape))
	}
	r.checkEffects(k)
	var stored struct{ Body string }
	require.NoError(t, json.Unmarshal(k.ResponseBody, &stored), "stored body %q", k.ResponseBody)
	again := r.send(a, stored.Body)
	if again.class() != "replay" || string(again.resp) != string(k.ResponseBody) {
		t.Errorf("an attempt after the race got %s, want a replay of %s", again, k.ResponseBody)
	}
}

// checkBody: a final answer (fresh or replayed) is the one for the sender's request.
func (r *rig) checkBody(x answer) {
	if x.status != statusOf(r.c.shape) || string(x.resp) != string(answerBody(r.key, []byte(x.body))) {
		r.t.Errorf("a final answer that is not this request's: %s", x)
	}
}

// checkEffects: one effect row per committed tx phase, all of the one key row; one
// remote effect per call phase, under that row's derived key.
func (r *rig) checkEffects(k idemflowtest.Key) {
	t := r.t
	rows, err := r.db.Pool.Query(r.ctx, `SELECT phase, row_id FROM m_effects WHERE scope = 'acct' AND key = $1`, r.key)
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var phase, rowID string
		require.NoError(t, rows.Scan(&phase, &rowID))
		got[phase]++
		if r.c.shape != shapeMiddleware && rowID != k.ID {
			t.Errorf("an effect of phase %s made under key row %s, not the key's row %s", phase, rowID, k.ID)
		}
	}
	require.NoError(t, rows.Err())
	want := expectedEffects(r.c)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("effect rows by phase %v, want %v", got, want)
	}
	var derived []string
	for _, e := range r.remote.Effects() {
		var b struct{ Key string }
		if json.Unmarshal(e.Body, &b) == nil && b.Key == r.key {
			derived = append(derived, e.Key)
		}
	}
	switch {
	case !hasCharge(r.c.shape) && len(derived) > 0:
		t.Errorf("remote effects %v for a flow that calls none", derived)
	case hasCharge(r.c.shape) && (len(derived) != 1 || derived[0] != k.ID+":charge"):
		t.Errorf("remote effects under derived keys %v, want one under %s:charge", derived, k.ID)
	}
}
