package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
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

// Effects a rollback cannot undo. Every effect the checker counted before was
// transactional, so an attempt that ran the user's code and then rolled back (a loser
// of a claim that ran its first statement, say) left nothing it looked at. The ledger
// flow's tx phases also do four things a rollback leaves in place, each observed from
// outside the phase's transaction:
//
//   - nextval on a sequence in the key's database (last_value counts every call);
//   - a transaction-scoped advisory lock, seen held in pg_locks by the side write below
//     (a committed transaction must have been seen holding it);
//   - a write to a second database, on a pool of its own (autocommit), recording the
//     phase's transaction id, its backend, the sequence value it drew and whether the
//     transaction owned the key (it held the claim lock, or the key row existed under
//     the run's identity, in progress);
//   - a POST to an HTTP side channel with the same transaction id.
//
// The checker then asks the server whether each recorded transaction committed
// (pg_xact_status: transaction ids are the cluster's, so the second database's records
// name the first's transactions) and requires, per key: exactly one committed record
// per tx phase the key's row went past, none for any other; every record made by an
// owner; every committed record also posted to the HTTP channel; no HTTP post that the
// database does not know. Records of transactions that rolled back are counted; an
// experiment with no faults (sideOpts.noRollbacks) requires none, and no sequence
// value drawn without a record. An attempt killed between its side effects and its
// commit legitimately leaves a rolled-back record: the claim guarantees that such an
// attempt owned the key, not that it committed.
const (
	ledgerFlow  = "ledger"
	phaseDebit  = "debit"
	phaseNotify = "notify"
	phasePost   = "post"
	ledgerRoute = "/v1/ledger"
	// ledgerSchema is part of every env's effect tables.
	ledgerSchema = `CREATE SEQUENCE rel_side_seq;
CREATE TABLE side_ledger (
	id        bigserial PRIMARY KEY,
	scope     text   NOT NULL,
	idem_key  text   NOT NULL,
	amount    bigint NOT NULL,
	notice_id text,
	status    text   NOT NULL DEFAULT 'debited'
);`
	// sideRecords lives in the second database.
	sideRecords = `CREATE TABLE rel_side (
	seq      bigint      PRIMARY KEY, -- the sequence value the phase drew
	scope    text        NOT NULL,
	idem_key text        NOT NULL,
	row_id   text        NOT NULL,    -- phases.Run.ID: the key row's identity
	phase    text        NOT NULL,
	attempt  int         NOT NULL,
	txid     bigint      NOT NULL,    -- the phase transaction's txid_current()
	pid      int         NOT NULL,
	owner    boolean     NOT NULL,    -- the transaction held the claim lock or the key row was its run's, in progress
	lock_seen boolean    NOT NULL,    -- from this connection: the phase's backend held the flow's advisory lock
	at       timestamptz NOT NULL DEFAULT clock_timestamp()
)`
)

var noticeID = phases.NewSlot[string]("notice_id")

// sideCfg is what a process needs to run the ledger flow: the second database and the
// HTTP side channel.
type sideCfg struct {
	DBURL   string
	HTTPURL string
}

// sideRun is a process's handle on the side channels.
type sideRun struct {
	pool *pgxpool.Pool
	http *http.Client
	url  string
}

// ledgerAnswer is the ledger flow's 201 body.
type ledgerAnswer struct {
	EntryID  int64  `json:"entry_id"`
	NoticeID string `json:"notice_id"`
	Amount   int64  `json:"amount"`
}

// effect does a phase's four effects that a rollback cannot undo (see above).
func (s *sideRun) effect(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
	var seq, txid int64
	var pid int32
	var owner bool
	// pg_locks shows a transaction its own locks: the claim lock is the engine's only
	// one-argument advisory lock (objsubid 1).
	if err := tx.QueryRow(ctx, `SELECT nextval('rel_side_seq'), txid_current(), pg_backend_pid(),
			EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid = 1 AND granted)
			OR EXISTS (SELECT 1 FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2 AND id = $3::uuid AND status = 'in_progress')`,
		run.Scope(), run.Key(), run.ID()).Scan(&seq, &txid, &pid, &owner); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1), 17)`, run.Scope()+"/"+run.Key()); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO rel_side (seq, scope, idem_key, row_id, phase, attempt, txid, pid, owner, lock_seen)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, EXISTS (SELECT 1 FROM pg_locks WHERE pid = $8 AND locktype = 'advisory'
			AND classid = hashtext($2 || '/' || $3)::oid AND objid = 17 AND objsubid = 2 AND granted))`,
		seq, run.Scope(), run.Key(), run.ID(), run.Phase(), run.Attempt(), txid, pid, owner); err != nil {
		return fmt.Errorf("side write: %w", err)
	}
	body, _ := json.Marshal(sidePost{Scope: run.Scope(), Key: run.Key(), Phase: run.Phase(), TxID: txid})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("side channel: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("side channel answered %d", resp.StatusCode)
	}
	return nil
}

// newLedgerFlow returns the ledger flow: debit (tx), notify (call to the provider's
// /v1/authorize; a failure is answered 503, which the engine must never store), post
// (tx).
func newLedgerFlow(s *sideRun, base string, client *http.Client) phases.Flow {
	amountOf := func(run *phases.Run) (int64, error) {
		var r orderRequest
		if err := json.Unmarshal(run.Body(), &r); err != nil || r.Amount <= 0 {
			return 0, phases.Fail(&phases.Response{Status: 400, Body: []byte(`{"error":"amount must be positive"}`)})
		}
		return r.Amount, nil
	}
	return phases.Flow{Name: ledgerFlow, Phases: []phases.Phase{
		phases.Tx(phaseDebit, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			amount, err := amountOf(run)
			if err != nil {
				return nil, err
			}
			if err := s.effect(ctx, tx, run); err != nil {
				return nil, err
			}
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO side_ledger (scope, idem_key, amount) VALUES ($1, $2, $3) RETURNING id`,
				run.Scope(), run.Key(), amount).Scan(&id); err != nil {
				return nil, err
			}
			return nil, orderID.Set(run, id)
		}),
		phases.Call(phaseNotify, func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			amount, err := amountOf(run)
			if err != nil {
				return nil, err
			}
			id, err := providerCall(ctx, client, base+"/v1/authorize", run.DerivedKey(), amount)
			if refused := (*providerRefused)(nil); errors.As(err, &refused) {
				// A 5xx answer of the phase: passed on to the client, never stored.
				return &phases.Response{Status: http.StatusServiceUnavailable, Body: []byte(`{"error":"notice service unavailable"}`)}, nil
			}
			if err != nil {
				return nil, err
			}
			return nil, noticeID.Set(run, id)
		}),
		phases.Tx(phasePost, func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := orderID.Get(run)
			if err != nil {
				return nil, err
			}
			notice, err := noticeID.Get(run)
			if err != nil {
				return nil, err
			}
			if err := s.effect(ctx, tx, run); err != nil {
				return nil, err
			}
			var amount int64
			if err := tx.QueryRow(ctx, `UPDATE side_ledger SET status = 'posted', notice_id = $2 WHERE id = $1 AND scope = $3 RETURNING amount`,
				id, notice, run.Scope()).Scan(&amount); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, ledgerAnswer{EntryID: id, NoticeID: notice, Amount: amount})
		}),
	}}
}

// sidePost is what a phase posts to the HTTP side channel.
type sidePost struct {
	Scope, Key, Phase string
	TxID              int64
}

// sideEnv is an env's side channels: the second database and the HTTP recorder.
type sideEnv struct {
	cfg   sideCfg
	pool  *pgxpool.Pool // the checker's pool on the second database
	mu    sync.Mutex
	posts map[int64]sidePost
}

// withSide gives the env a second database (on the same server) and an HTTP side
// channel, and registers the ledger flow on every engine and child it makes.
func (e *env) withSide(t testing.TB) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "rel_side_" + strings.TrimPrefix(e.appName, "rel_t_") // unique per env, whatever its schema
	_, err := e.db.Pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	admin := e.db.Pool
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop side database: %v", err)
		}
	})
	cc, err := pgx.ParseConfig(e.db.URL)
	require.NoError(t, err)
	url := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cc.Host, cc.Port, cc.User, name)
	if cc.Password != "" {
		url += " password=" + cc.Password
	}
	s := &sideEnv{posts: map[int64]sidePost{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p sidePost
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.posts[p.TxID] = p
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	s.cfg = sideCfg{DBURL: url, HTTPURL: srv.URL}
	s.pool, err = pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	_, err = s.pool.Exec(ctx, sideRecords)
	require.NoError(t, err)
	e.side = s
	run, err := openSide(ctx, s.cfg)
	require.NoError(t, err)
	t.Cleanup(run.close)
	e.sideRun = run
	return e
}

// openSide opens a process's handle on the side channels of cfg; it is closed by
// close.
func openSide(ctx context.Context, cfg sideCfg) (*sideRun, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DBURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	return &sideRun{pool: pool, http: &http.Client{Timeout: 10 * time.Second}, url: cfg.HTTPURL}, nil
}

func (s *sideRun) close() { s.pool.Close() }

// sideOpts tune the side-effect check.
type sideOpts struct {
	// noRollbacks: the experiment injected no fault, so no phase transaction may have
	// rolled back after its side effects, and no sequence value may be unrecorded.
	noRollbacks bool
}

// sideReport is what the side-effect check counted.
type sideReport struct {
	Records, Committed, RolledBack, NotOwner, LockUnseen, HTTPPosts, HTTPMissing, SeqDrawn, SeqUnrecorded int
}

func (s sideReport) String() string {
	return fmt.Sprintf("side_records=%d committed=%d rolled_back=%d not_owner=%d lock_unseen=%d http_posts=%d http_missing=%d seq_drawn=%d seq_unrecorded=%d",
		s.Records, s.Committed, s.RolledBack, s.NotOwner, s.LockUnseen, s.HTTPPosts, s.HTTPMissing, s.SeqDrawn, s.SeqUnrecorded)
}

// checkSide runs the side-effect check against the key rows the checker read.
func (e *env) checkSide(ctx context.Context, t testing.TB, r *report, keys map[[2]string]*keyRow, o sideOpts) {
	t.Helper()
	seen := e.readSide(ctx, t)
	var s sideReport
	s.HTTPPosts = len(seen.posts)
	if seen.seqCalled {
		s.SeqDrawn = int(seen.seqLast)
	}
	s.SeqUnrecorded = s.SeqDrawn - len(seen.recs)
	committed := checkSideRecords(r, &s, seen, keys, o)
	if o.noRollbacks && s.SeqUnrecorded != 0 {
		r.violate("%d sequence values were drawn without a side record, with no fault injected", s.SeqUnrecorded)
	}
	checkSidePerKey(r, keys, committed)
	r.Side = &s
	t.Logf("side effects: %s", s)
}

// sideRec is one row of rel_side: a side effect a tx phase's transaction made in the
// second database.
type sideRec struct {
	seq                      int64
	scope, key, rowID, phase string
	txid                     int64
	owner, lockSeen          bool
}

// sideSeen is what the side-effect check reads: the second database's records, the
// status of each record's transaction, its sequence, and the HTTP side channel.
type sideSeen struct {
	recs      []sideRec
	status    map[int64]string // txid -> pg_xact_status
	seqLast   int64
	seqCalled bool
	posts     map[int64]sidePost
}

func (e *env) readSide(ctx context.Context, t testing.TB) sideSeen {
	t.Helper()
	var seen sideSeen
	rows, err := e.side.pool.Query(ctx, `SELECT seq, scope, idem_key, row_id, phase, txid, owner, lock_seen FROM rel_side ORDER BY seq`)
	require.NoError(t, err)
	for rows.Next() {
		var x sideRec
		require.NoError(t, rows.Scan(&x.seq, &x.scope, &x.key, &x.rowID, &x.phase, &x.txid, &x.owner, &x.lockSeen))
		seen.recs = append(seen.recs, x)
	}
	require.NoError(t, rows.Err())
	txids := make([]int64, len(seen.recs))
	for i, x := range seen.recs {
		txids[i] = x.txid
	}
	seen.status = map[int64]string{}
	srows, err := e.db.Pool.Query(ctx, `SELECT x, coalesce(pg_xact_status(x::text::xid8), 'unknown') FROM unnest($1::bigint[]) x`, txids)
	require.NoError(t, err)
	for srows.Next() {
		var x int64
		var st string
		require.NoError(t, srows.Scan(&x, &st))
		seen.status[x] = st
	}
	require.NoError(t, srows.Err())
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT last_value, is_called FROM rel_side_seq`).Scan(&seen.seqLast, &seen.seqCalled))
	e.side.mu.Lock()
	seen.posts = make(map[int64]sidePost, len(e.side.posts))
	for k, v := range e.side.posts {
		seen.posts[k] = v
	}
	e.side.mu.Unlock()
	return seen
}

// checkSideRecords checks each side record against its transaction's fate and the
// HTTP side channel, and returns the committed records per (scope, key, phase).
func checkSideRecords(r *report, s *sideReport, seen sideSeen, keys map[[2]string]*keyRow, o sideOpts) map[[3]string]int {
	known := map[int64]bool{}
	committed := map[[3]string]int{} // (scope, key, phase) -> committed records
	for _, x := range seen.recs {
		s.Records++
		known[x.txid] = true
		if !x.owner {
			s.NotOwner++
			r.violate("side effect of %s/%s phase %s (tx %d) made by a transaction that did not own the key", x.scope, x.key, x.phase, x.txid)
		}
		if !x.lockSeen {
			// A backend terminated between taking the lock and the side write
			// lost the lock with its transaction: only a committed record must have
			// seen it (a transaction holds its locks until it commits).
			s.LockUnseen++
		}
		switch st := seen.status[x.txid]; st {
		case "committed":
			s.Committed++
			if !x.lockSeen {
				r.violate("committed side effect of %s/%s phase %s (tx %d): its advisory lock was not seen held", x.scope, x.key, x.phase, x.txid)
			}
			committed[[3]string{x.scope, x.key, x.phase}]++
			if k := keys[[2]string{x.scope, x.key}]; k == nil || k.id != x.rowID {
				r.violate("committed side effect of %s/%s phase %s under row %s, which is not the key's row", x.scope, x.key, x.phase, x.rowID)
			}
			if _, ok := seen.posts[x.txid]; !ok {
				s.HTTPMissing++
				r.violate("committed side effect of %s/%s phase %s (tx %d) never reached the HTTP side channel", x.scope, x.key, x.phase, x.txid)
			}
		case "aborted":
			s.RolledBack++
			if o.noRollbacks {
				r.violate("side effect of %s/%s phase %s (tx %d, attempt's transaction rolled back) with no fault injected", x.scope, x.key, x.phase, x.txid)
			}
		default:
			r.violate("side effect of %s/%s phase %s: transaction %d is %s after the experiment", x.scope, x.key, x.phase, x.txid, st)
		}
	}
	for txid, p := range seen.posts {
		if !known[txid] {
			r.violate("HTTP side channel got %s/%s phase %s from transaction %d, which the second database never recorded", p.Scope, p.Key, p.Phase, txid)
		}
	}
	return committed
}

// checkSidePerKey: exactly one committed record per tx phase the row went past, none
// for others, and none for a key with no ledger row.
func checkSidePerKey(r *report, keys map[[2]string]*keyRow, committed map[[3]string]int) {
	var ks [][2]string
	for sk, k := range keys {
		if k.flow == ledgerFlow {
			ks = append(ks, sk)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i][1] < ks[j][1] })
	for _, sk := range ks {
		k := keys[sk]
		want := map[string]int{}
		switch {
		case k.status == "finished" && k.respStatus != nil && *k.respStatus == http.StatusCreated:
			want[phaseDebit], want[phasePost] = 1, 1
		case k.status == "finished" && k.respStatus != nil && *k.respStatus == http.StatusBadRequest:
			// refused before any side effect
		case rank(ledgerFlow, k.rp) >= rank(ledgerFlow, phaseDebit):
			want[phaseDebit] = 1
		}
		for _, ph := range []string{phaseDebit, phasePost} {
			if got := committed[[3]string{sk[0], sk[1], ph}]; got != want[ph] {
				r.violate("key %s/%s (%s at %s): phase %s committed its side effects %d times, want %d", sk[0], sk[1], k.status, k.rp, ph, got, want[ph])
			}
			delete(committed, [3]string{sk[0], sk[1], ph})
		}
	}
	for k, n := range committed {
		r.violate("committed side effects of %s/%s phase %s (%d) for a key with no ledger row", k[0], k[1], k[2], n)
	}
}

// TestSideEffects races concurrent duplicates of new keys of the ledger flow (each
// duplicate a patient client that retries until it gets a final answer), with the
// provider failing some calls (answered 503, never stored), and no other fault: no
// phase transaction may roll back after its side effects, each tx phase's effects
// that a rollback cannot undo happen exactly once per key, and none is made by a
// transaction that did not own the key. Backs invariants 9 (losers run nothing) and 1.
func TestSideEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t)).withSide(t)
	var busy atomic.Int64
	en := env.engine(env.pool(poolOpts{maxConns: 8}), &workflow.Config{Hooks: workflow.Hooks{
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if errors.Is(err, workflow.ErrClaimBusy) {
				busy.Add(1)
			}
		},
	}})
	n, dups := scale(16, 200, 1500), 6
	var keys [][2]string
	var errs []error
	var mu sync.Mutex
	for i := range n {
		key := fmt.Sprintf("side|%d", i)
		req := request("acct", key, ledgerFlow, int64(100+i))
		keys = append(keys, [2]string{"acct", key})
		if i%4 == 0 {
			env.provider.FailNext(1)
		}
		var start, wg sync.WaitGroup
		start.Add(1)
		for range dups {
			wg.Go(func() {
				start.Wait()
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if _, err := env.retryUntilFinal(rctx, en, req, 20*time.Second); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		start.Done()
		wg.Wait()
	}
	r := env.check(t, checkOpts{keys: keys, side: sideOpts{noRollbacks: true}})
	require.Empty(t, errs)
	_, _, _, failed := env.provider.snapshot()
	require.Positive(t, busy.Load(), "no duplicate lost a claim race")
	require.Positive(t, failed, "no provider call failed")
	t.Logf("side effects: keys=%d duplicates_per_key=%d claim_races_lost=%d provider_failures=%d duplicates=%d unfinished=%d %s",
		n, dups, busy.Load(), failed, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.Side)
}
