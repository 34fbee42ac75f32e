package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// counts is what a pool sent, as its tracer and its sockets saw it.
type counts struct {
	Statements int64 // SQL statements, BEGIN and COMMIT included
	RoundTrips int64 // pgx calls: each query and each batch is one
	Wire       int64 // client-to-server turns on the sockets: writes that follow a read
	Commits    int64 // transactions ended by a commit: COMMIT, or an autocommit statement or batch
}

func (c counts) sub(o counts) counts {
	return counts{c.Statements - o.Statements, c.RoundTrips - o.RoundTrips, c.Wire - o.Wire, c.Commits - o.Commits}
}

// tracer is a pool's pgx tracer: it counts statements, round trips and commits, and,
// while a tracker is set, which request holds which connection.
type tracer struct {
	statements, roundTrips, wire, commits atomic.Int64
	track                                 atomic.Pointer[tracker]
	prof                                  *rtProfile // set by -rtprofile
}

var (
	_ pgx.QueryTracer       = (*tracer)(nil)
	_ pgx.BatchTracer       = (*tracer)(nil)
	_ pgx.PrepareTracer     = (*tracer)(nil)
	_ pgxpool.AcquireTracer = (*tracer)(nil)
	_ pgxpool.ReleaseTracer = (*tracer)(nil)
)

// install sets t as cfg's tracer and wraps its sockets to count wire turns. Sockets
// count only after the connection is established, so connecting is not counted.
func (t *tracer) install(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = t
	cfg.ConnConfig.DialFunc = t.dialer(&net.Dialer{})
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if w, ok := c.PgConn().Conn().(*wireConn); ok {
			w.counting.Store(true)
		}
		if prev != nil {
			return prev(ctx, c)
		}
		return nil
	}
}

func (t *tracer) dialer(d *net.Dialer) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c, n: &t.wire}, nil
	}
}

func (t *tracer) snapshot() counts {
	return counts{t.statements.Load(), t.roundTrips.Load(), t.wire.Load(), t.commits.Load()}
}

func (t *tracer) setTracker(k *tracker) { t.track.Store(k) }

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	t.statements.Add(1)
	t.roundTrips.Add(1)
	if t.prof != nil {
		return context.WithValue(ctx, rtKey{}, &rtStart{t: time.Now(), label: []string{shortSQL(data.SQL)}})
	}
	return ctx
}

// TraceQueryEnd counts a commit when a successful statement leaves the connection
// outside a transaction: an explicit COMMIT that committed, or an autocommit statement.
func (t *tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if st, ok := ctx.Value(rtKey{}).(*rtStart); ok && t.prof != nil {
		t.prof.add(strings.Join(st.label, " + "), time.Since(st.t))
	}
	if data.Err != nil || conn.PgConn().TxStatus() != 'I' {
		return
	}
	if tag := data.CommandTag.String(); tag == "ROLLBACK" || tag == "" {
		return
	}
	t.commits.Add(1)
}

func (t *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	t.roundTrips.Add(1)
	if t.prof != nil {
		st := &rtStart{t: time.Now()}
		for _, q := range data.Batch.QueuedQueries {
			st.label = append(st.label, shortSQL(q.SQL))
		}
		return context.WithValue(ctx, rtKey{}, st)
	}
	return ctx
}

func (t *tracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, _ pgx.TraceBatchQueryData) {
	t.statements.Add(1)
}

// TraceBatchEnd counts a commit when a successful batch leaves the connection outside a
// transaction: it ended with COMMIT, or ran as one implicit transaction.
func (t *tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if st, ok := ctx.Value(rtKey{}).(*rtStart); ok && t.prof != nil {
		t.prof.add(strings.Join(st.label, " + "), time.Since(st.t))
	}
	if data.Err == nil && conn.PgConn().TxStatus() == 'I' {
		t.commits.Add(1)
	}
}

// TracePrepareStart counts an explicit or cache-filling prepare as a round trip of its
// own (it is one); with warm statement caches there are none.
func (t *tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	t.roundTrips.Add(1)
	return ctx
}

func (t *tracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (t *tracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (t *tracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if k := t.track.Load(); k != nil && data.Err == nil {
		k.acquired(ctx, data.Conn)
	}
}

func (t *tracer) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	if k := t.track.Load(); k != nil {
		k.released(data.Conn)
	}
}

// wireConn counts turns of the conversation: a write that follows a read (or is the
// first) starts a new round trip. Writes that follow writes are one message stream.
type wireConn struct {
	net.Conn
	n        *atomic.Int64
	counting atomic.Bool
	wrote    atomic.Bool // the last operation was a write
}

func (c *wireConn) Write(b []byte) (int, error) {
	if !c.wrote.Swap(true) && c.counting.Load() {
		c.n.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *wireConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.wrote.Store(false)
	}
	return n, err
}

// reqState is one request in flight, carried in its context while a tracker is set.
type reqState struct {
	k      *tracker
	inCall bool
	held   int // connections it holds
}

type reqKey struct{}

func withReq(ctx context.Context, rs *reqState) context.Context {
	return context.WithValue(ctx, reqKey{}, rs)
}

func reqFrom(ctx context.Context) *reqState {
	rs, _ := ctx.Value(reqKey{}).(*reqState)
	return rs
}

// tracker follows requests, their call phases and the pool connections they hold,
// exactly (under one mutex), for the slow-provider run.
type tracker struct {
	mu     sync.Mutex
	held   map[*pgx.Conn]*reqState
	byPID  map[uint32]*reqState
	active int // requests in flight
	inCall int // requests in a call phase

	heldInCall  int // connections acquired by a request in its call phase
	callHolding int // call phases started while the request held a connection
	overUse     int // acquisitions that made connections in use exceed requests outside a call
	maxInUse    int
	acquires    int
	unknown     int // acquisitions with no request in the context
}

func newTracker() *tracker {
	return &tracker{held: map[*pgx.Conn]*reqState{}, byPID: map[uint32]*reqState{}}
}

func (k *tracker) begin(rs *reqState) {
	k.mu.Lock()
	k.active++
	k.mu.Unlock()
}

func (k *tracker) end(rs *reqState) {
	k.mu.Lock()
	k.active--
	if rs.inCall {
		rs.inCall = false
		k.inCall--
	}
	k.mu.Unlock()
}

func (k *tracker) callStart(rs *reqState) {
	k.mu.Lock()
	if !rs.inCall {
		rs.inCall = true
		k.inCall++
	}
	if rs.held > 0 {
		k.callHolding++
	}
	k.mu.Unlock()
}

func (k *tracker) callEnd(rs *reqState) {
	k.mu.Lock()
	if rs.inCall {
		rs.inCall = false
		k.inCall--
	}
	k.mu.Unlock()
}

func (k *tracker) acquired(ctx context.Context, c *pgx.Conn) {
	rs := reqFrom(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.acquires++
	if rs == nil {
		k.unknown++
		rs = &reqState{}
	}
	rs.held++
	k.held[c] = rs
	k.byPID[c.PgConn().PID()] = rs
	if rs.inCall {
		k.heldInCall++
	}
	inUse := len(k.held)
	k.maxInUse = max(k.maxInUse, inUse)
	if inUse > k.active-k.inCall {
		k.overUse++
	}
}

func (k *tracker) released(c *pgx.Conn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if rs, ok := k.held[c]; ok {
		rs.held--
		delete(k.held, c)
		delete(k.byPID, c.PgConn().PID())
	}
}

// holderInCall reports whether the backend pid is held by a request in its call phase.
func (k *tracker) holderInCall(pid uint32) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	rs, ok := k.byPID[pid]
	return ok && rs.inCall
}

// rtProfile accumulates time per kind of round trip, for -rtprofile.
type rtProfile struct {
	mu    sync.Mutex
	kinds map[string]*rtKind
}

type rtKind struct {
	n     int
	total time.Duration
	max   time.Duration
}

type rtStart struct {
	t     time.Time
	label []string
}

type rtKey struct{}

func (p *rtProfile) add(label string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kinds == nil {
		p.kinds = map[string]*rtKind{}
	}
	k := p.kinds[label]
	if k == nil {
		k = &rtKind{}
		p.kinds[label] = k
	}
	k.n++
	k.total += d
	k.max = max(k.max, d)
}

// reset forgets what p accumulated.
func (p *rtProfile) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kinds = nil
}

// totals is the time (ms) and count of each kind of round trip.
func (p *rtProfile) totals() (map[string]float64, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, n := map[string]float64{}, map[string]int{}
	for label, k := range p.kinds {
		t[label], n[label] = ms(k.total), k.n
	}
	return t, n
}

func shortSQL(sql string) string {
	f := strings.Fields(sql)
	if len(f) > 4 {
		f = f[:4]
	}
	return strings.Join(f, " ")
}
