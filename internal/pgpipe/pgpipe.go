package pgpipe

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// customKey is the registry's key in a connection's pgconn CustomData.
const customKey = "idemflow/pgpipe"

// namePrefix starts the names of the statements this package prepares: pgx's own are
// "stmtcache_<hash>", so the two never meet on a connection.
const namePrefix = "idemflow_"

// Send sends b on conn, as conn.SendBatch does, in the statement-cache exec modes
// through the connection's registry (see the package doc), otherwise through
// conn.SendBatch. The connection must not be in use by anything else until the
// results are closed.
func Send(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) pgx.BatchResults {
	return SendGuarded(ctx, conn, b, 0)
}

// SendGuarded is Send for a batch whose first guard statements decide whether the
// rest may run: each raises when it says no. The server acts on nothing of the rest
// (no Parse, which takes the locks of the tables a statement names, no Describe, Bind
// or Execute) before the guard's statements ran without an error. A statement of the
// rest that the connection has not prepared is prepared after them in the same
// pipeline, and the rest is sent once they came back (see the package doc). Guard 0
// is Send.
func SendGuarded(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, guard int) pgx.BatchResults {
	return SendRechecked(ctx, conn, b, guard, 0)
}

// SendRechecked is SendGuarded for a guard whose last recheck statements only check
// something another transaction may change (they change nothing and raise when they
// say no, so running them twice is harmless). When the rest goes in a round trip of
// its own (a statement of it not prepared on the connection yet), those statements are
// sent again at its head: what they checked then holds as near to the rest as when
// the whole batch goes in one round trip, rather than a round trip (and whatever
// paused the caller in between) earlier. A recheck that raises is the error of the
// rest's first statement, as a *RecheckError, and the server runs nothing of the rest.
func SendRechecked(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, guard, recheck int) pgx.BatchResults {
	if guard >= len(b.QueuedQueries) {
		guard = 0
	}
	recheck = min(max(recheck, 0), guard)
	r := registryOf(conn)
	if r == nil || (!r.keep && guard == 0) {
		return conn.SendBatch(ctx, b)
	}
	if !fits(b, guard > 0) {
		return conn.SendBatch(ctx, b)
	}
	return r.send(ctx, conn, b, guard, recheck)
}

// RecheckError is the error of the first statement after a guard when a statement of
// the guard, sent again ahead of it (SendRechecked), raised: the statement never ran.
type RecheckError struct {
	Index int   // the guard statement's index in the batch
	Err   error // its error, the server's
}

func (e *RecheckError) Error() string {
	return fmt.Sprintf("statement %d of the batch, sent again ahead of the rest: %v", e.Index, e.Err)
}

func (e *RecheckError) Unwrap() error { return e.Err }

// Guardable reports whether a guard queued ahead of b's statements would keep them
// from the server until it came back, in SendGuarded: whether each of them can go
// through the registry (see the package doc). A batch it refuses goes to
// conn.SendBatch with no guarantee.
func Guardable(b *pgx.Batch) bool { return fits(b, true) }

// rewrite applies the QueryRewriter (pgx.NamedArgs) that starts a statement's
// arguments, in place, as pgx's SendBatch does.
func rewrite(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) error {
	for _, q := range b.QueuedQueries {
		var rw pgx.QueryRewriter
		args := q.Arguments
		for len(args) > 0 {
			a, ok := args[0].(pgx.QueryRewriter)
			if !ok {
				break
			}
			rw, args = a, args[1:]
		}
		if rw == nil {
			continue
		}
		sql, args, err := rw.RewriteQuery(ctx, conn, q.SQL, args)
		if err != nil {
			return fmt.Errorf("rewrite query failed: %w", err)
		}
		q.SQL, q.Arguments = sql, args
	}
	return nil
}

// fits reports whether every statement of b can go through the registry. Named
// arguments (a QueryRewriter) go to pgx, but in a guarded batch, which the registry
// rewrites itself: pgx would prepare the rewritten statements ahead of the guard's.
func fits(b *pgx.Batch, rewrites bool) bool {
	if len(b.QueuedQueries) == 0 || beganTx(b) {
		return false
	}
	for _, q := range b.QueuedQueries {
		if preparedName(q.SQL) {
			return false
		}
		if len(q.Arguments) > 0 {
			switch q.Arguments[0].(type) {
			case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
				return false
			case pgx.QueryRewriter:
				if !rewrites {
					return false
				}
			}
		}
	}
	return true
}

// preparedName reports whether sql may be the name of a statement prepared with
// Conn.Prepare, which pgx sends by name: one word, but for the statements of one word
// the engine sends. Empty SQL is no name (pgx's statement cache panics on it).
func preparedName(sql string) bool {
	if sql == "" || strings.ContainsAny(sql, " \t\r\n;") {
		return false
	}
	switch strings.ToUpper(sql) {
	case "COMMIT", "ROLLBACK", "BEGIN", "END":
		return false
	}
	return true
}

// beganTx reports whether b was started with Batch.BeginTx: its results must carry the
// transaction (BatchResults.Tx), which only pgx can make.
func beganTx(b *pgx.Batch) bool {
	f := reflect.ValueOf(b).Elem().FieldByName("txOptions")
	return f.IsValid() && f.Kind() == reflect.Pointer && !f.IsNil()
}

// registry is one connection's statements.
type registry struct {
	named    bool // cache-statement mode: prepared under names; else descriptions only
	keep     bool // false in describe-exec mode: every send describes its statements
	capacity int
	tracer   pgx.BatchTracer
	bySQL    map[string]*list.Element // of *entry
	lru      list.List                // front: most recently used
	stale    []string                 // names to close in the next round trip that prepares
	next     uint64                   // the next name's number
	gen      uint64                   // the current send, to pin its entries
	eqb      pgx.ExtendedQueryBuilder
}

// entry is one statement of a registry.
type entry struct {
	sd   *pgconn.StatementDescription
	used uint64 // gen of the last send that used it
}

// registryOf is conn's registry, made on first use; nil for a connection whose exec
// mode never describes a statement ahead of its execution (the decision is kept too).
func registryOf(conn *pgx.Conn) *registry {
	data := conn.PgConn().CustomData()
	if r, ok := data[customKey].(*registry); ok {
		return r
	}
	r := newRegistry(conn.Config())
	data[customKey] = r
	return r
}

// newRegistry is the registry for a connection configured as cfg, or nil.
func newRegistry(cfg *pgx.ConnConfig) *registry {
	r := &registry{bySQL: map[string]*list.Element{}}
	switch {
	case cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cfg.StatementCacheCapacity > 0:
		r.named, r.keep, r.capacity = true, true, cfg.StatementCacheCapacity
	case cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe && cfg.DescriptionCacheCapacity > 0:
		r.keep, r.capacity = true, cfg.DescriptionCacheCapacity
	case cfg.DefaultQueryExecMode == pgx.QueryExecModeDescribeExec:
		// Keeps nothing, describing every statement on every use: only a guarded
		// batch comes here.
	default:
		return nil
	}
	r.tracer, _ = cfg.Tracer.(pgx.BatchTracer)
	return r
}

// send sends b's statements in one pipeline, after a round trip that prepares the
// statements the registry does not have; or, when a statement after the guard's is
// one of those, as sendGuarded does.
func (r *registry) send(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, guard, recheck int) *batchResults {
	br := &batchResults{ctx: ctx, conn: conn, r: r, b: b}
	if r.tracer != nil {
		br.ctx = r.tracer.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
	}
	if guard > 0 {
		if err := rewrite(br.ctx, conn, b); err != nil {
			return br.early(err)
		}
	}
	var fresh []*pgconn.StatementDescription
	br.sds, fresh = r.lookup(b, br.sdsBuf[:0])
	br.formats = br.formatsBuf[:0]
	br.pipe = conn.PgConn().StartPipeline(br.ctx)
	if guard > 0 && r.freshAfter(b, guard, fresh) {
		return br.sendGuarded(guard, recheck, fresh)
	}
	if err := r.prepare(br.pipe, conn, fresh); err != nil {
		return br.early(err)
	}
	if err := br.queue(0, len(b.QueuedQueries), 0); err != nil {
		return br.early(err) // unsynced requests: pgconn closes the connection, as in pgx
	}
	if err := br.pipe.Sync(); err != nil {
		return br.early(err)
	}
	return br
}

// freshAfter reports whether a statement of b after the first guard is not in the
// registry (fresh lists those).
func (r *registry) freshAfter(b *pgx.Batch, guard int, fresh []*pgconn.StatementDescription) bool {
	if len(fresh) == 0 {
		return false
	}
	for _, q := range b.QueuedQueries[guard:] {
		if _, ok := r.bySQL[q.SQL]; !ok {
			return true
		}
	}
	return false
}

// sendGuarded sends the guard's statements, then the closing of stale names and the
// Parse and Describe of every fresh statement, and a Flush, which makes the server
// answer all of it without ending the transaction. The server runs what follows a
// statement that raised only after a Sync, so a guard that raises makes it skip every
// Parse. A fresh statement of the guard runs as pgx's exec mode sends it (the unnamed
// statement, argument types from their Go values), so that no round trip precedes
// the guard's. The rest of the batch is sent once its first result is asked for
// (sendRest), or the batch is closed (Close), after the guard's last recheck
// statements, sent again.
func (br *batchResults) sendGuarded(guard, recheck int, fresh []*pgconn.StatementDescription) *batchResults {
	if err := br.queue(0, guard, guard); err != nil {
		return br.early(err) // unsynced requests: pgconn closes the connection, as in pgx
	}
	closing := br.r.closing(br.conn)
	for _, name := range closing {
		br.pipe.SendDeallocate(name)
	}
	for _, sd := range fresh {
		br.pipe.SendPrepare(sd.Name, sd.SQL, nil)
	}
	br.pipe.SendFlushRequest()
	if err := br.pipe.Flush(); err != nil {
		return br.early(err)
	}
	br.rest = &rest{from: guard, recheck: recheck, fresh: fresh, closing: closing}
	return br
}

// queue builds statements [from, to) of the batch and adds them to the pipeline; the
// fresh ones of those before exec are sent as pgx's exec mode sends them.
func (br *batchResults) queue(from, to, exec int) error {
	r, tm := br.r, br.conn.TypeMap()
	for i := from; i < to; i++ {
		q, sd := br.b.QueuedQueries[i], br.sds[i]
		if i < exec && !r.known(sd) {
			if err := r.eqb.Build(tm, nil, q.Arguments); err != nil {
				return fmt.Errorf("build statement %d of the batch: %w", i, err)
			}
			br.pipe.SendQueryParams(q.SQL, r.eqb.ParamValues, nil, r.eqb.ParamFormats, r.eqb.ResultFormats)
			continue
		}
		if err := r.eqb.Build(tm, sd, q.Arguments); err != nil {
			return fmt.Errorf("build statement %d of the batch: %w", i, err)
		}
		if r.named {
			// pgconn keeps the result formats until the results are read; Build reuses
			// its slices. Each statement's are a segment of formats, which only grows.
			n := len(br.formats)
			br.formats = append(br.formats, r.eqb.ResultFormats...)
			br.pipe.SendQueryStatement(sd, r.eqb.ParamValues, r.eqb.ParamFormats, br.formats[n:len(br.formats):len(br.formats)])
		} else {
			br.pipe.SendQueryParams(sd.SQL, r.eqb.ParamValues, sd.ParamOIDs, r.eqb.ParamFormats, r.eqb.ResultFormats)
		}
	}
	return nil
}

// known reports whether sd is the registry's: prepared (described) before this send.
func (r *registry) known(sd *pgconn.StatementDescription) bool {
	el, ok := r.bySQL[sd.SQL]
	return ok && el.Value.(*entry).sd == sd
}

// lookup finds the description of each statement of b, in sds (an empty slice whose
// room is used when it suffices), and lists those the registry does not have (each
// once) with the names they will be prepared under.
func (r *registry) lookup(b *pgx.Batch, sds []*pgconn.StatementDescription) (_, fresh []*pgconn.StatementDescription) {
	r.gen++
	if n := len(b.QueuedQueries); cap(sds) >= n {
		sds = sds[:n]
		clear(sds)
	} else {
		sds = make([]*pgconn.StatementDescription, n)
	}
	for i, q := range b.QueuedQueries {
		if el, ok := r.bySQL[q.SQL]; ok {
			e := el.Value.(*entry)
			e.used = r.gen
			r.lru.MoveToFront(el)
			sds[i] = e.sd
			continue
		}
		for _, sd := range fresh {
			if sd.SQL == q.SQL {
				sds[i] = sd
				break
			}
		}
		if sds[i] == nil {
			sds[i] = &pgconn.StatementDescription{SQL: q.SQL}
			if r.named {
				r.next++
				sds[i].Name = namePrefix + strconv.FormatUint(r.next, 10)
			}
			fresh = append(fresh, sds[i])
		}
	}
	return sds, fresh
}

// prepare closes the stale names and describes (in cache-statement mode also
// prepares) fresh, in one round trip, and adds fresh to the registry. Nothing is sent
// when there is nothing to do.
func (r *registry) prepare(pipe *pgconn.Pipeline, conn *pgx.Conn, fresh []*pgconn.StatementDescription) error {
	if len(fresh) == 0 {
		return nil
	}
	closing := r.closing(conn)
	for _, name := range closing {
		pipe.SendDeallocate(name)
	}
	for _, sd := range fresh {
		pipe.SendPrepare(sd.Name, sd.SQL, nil)
	}
	if err := pipe.Sync(); err != nil {
		r.unsure(fresh)
		return err
	}
	if err := r.prepared(pipe, fresh, closing); err != nil {
		return err
	}
	if _, err := expect[*pgconn.PipelineSync](pipe); err != nil {
		return err
	}
	return nil
}

// closing is the stale names to close in a round trip that prepares: none in an
// aborted transaction (they are closed later).
func (r *registry) closing(conn *pgx.Conn) []string {
	if st := conn.PgConn().TxStatus(); st != 'I' && st != 'T' {
		return nil
	}
	return r.stale
}

// prepared reads the answers to the closing of closing and the preparing of fresh,
// and adds fresh to the registry.
func (r *registry) prepared(pipe *pgconn.Pipeline, fresh []*pgconn.StatementDescription, closing []string) error {
	for range closing {
		if _, err := expect[*pgconn.CloseComplete](pipe); err != nil {
			r.unsure(fresh)
			return err
		}
	}
	r.stale = r.stale[len(closing):]
	for _, sd := range fresh {
		got, err := expect[*pgconn.StatementDescription](pipe)
		if err != nil {
			r.unsure(fresh)
			return fmt.Errorf("prepare: %w", err)
		}
		sd.ParamOIDs, sd.Fields = got.ParamOIDs, got.Fields
	}
	for _, sd := range fresh {
		r.add(sd)
	}
	return nil
}

// unsure notes that some of fresh may have been prepared under their names: they are
// closed in the next round trip that prepares (closing a name that does not exist is
// no error).
func (r *registry) unsure(fresh []*pgconn.StatementDescription) {
	for _, sd := range fresh {
		if sd.Name != "" {
			r.stale = append(r.stale, sd.Name)
		}
	}
}

// expect reads the pipeline's next result, of type T.
func expect[T any](pipe *pgconn.Pipeline) (T, error) {
	var zero T
	res, err := pipe.GetResults()
	if err != nil {
		return zero, err
	}
	got, ok := res.(T)
	if !ok {
		return zero, fmt.Errorf("expected %T, got %T", zero, res)
	}
	return got, nil
}

// add registers sd, evicting the least recently used statements beyond the capacity
// that the current send does not use.
func (r *registry) add(sd *pgconn.StatementDescription) {
	if !r.keep {
		return
	}
	r.bySQL[sd.SQL] = r.lru.PushFront(&entry{sd: sd, used: r.gen})
	for r.lru.Len() > r.capacity {
		el := r.lru.Back()
		if el.Value.(*entry).used == r.gen {
			return // the batch needs more than the capacity: it stays over until next time
		}
		r.remove(el)
	}
}

// remove forgets a statement; its name is closed in the next round trip that prepares.
func (r *registry) remove(el *list.Element) {
	e := r.lru.Remove(el).(*entry)
	delete(r.bySQL, e.sd.SQL)
	if e.sd.Name != "" {
		r.stale = append(r.stale, e.sd.Name)
	}
}

// failed forgets what an error of sd's statement says no longer holds: all the
// statements when the server lost a name, sd when it cannot run as prepared or, in
// describe mode, when the server refused its Bind (08P01: the description's result
// formats no longer match the statement's columns, after ALTER TABLE).
func (r *registry) failed(sd *pgconn.StatementDescription, err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return
	}
	switch {
	case pgErr.Code == "26000":
		for r.lru.Len() > 0 {
			r.remove(r.lru.Back())
		}
	case pgErr.Code[:2] == "0A" || pgErr.Code[:2] == "42" || pgErr.Code == "08P01":
		if el, ok := r.bySQL[sd.SQL]; ok && el.Value.(*entry).sd == sd {
			r.remove(el)
		}
	}
}
