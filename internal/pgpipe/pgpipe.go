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
	r := registryOf(conn)
	if r == nil || !fits(b) {
		return conn.SendBatch(ctx, b)
	}
	return r.send(ctx, conn, b)
}

// fits reports whether every statement of b can go through the registry.
func fits(b *pgx.Batch) bool {
	if len(b.QueuedQueries) == 0 || beganTx(b) {
		return false
	}
	for _, q := range b.QueuedQueries {
		if preparedName(q.SQL) {
			return false
		}
		if len(q.Arguments) > 0 {
			switch q.Arguments[0].(type) {
			case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
				return false
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
// mode keeps nothing per statement (the decision is kept too).
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
		r.named, r.capacity = true, cfg.StatementCacheCapacity
	case cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe && cfg.DescriptionCacheCapacity > 0:
		r.capacity = cfg.DescriptionCacheCapacity
	default:
		return nil
	}
	r.tracer, _ = cfg.Tracer.(pgx.BatchTracer)
	return r
}

// send sends b's statements in one pipeline, after a round trip that prepares the
// statements the registry does not have.
func (r *registry) send(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) *batchResults {
	br := &batchResults{ctx: ctx, conn: conn, r: r, b: b}
	if r.tracer != nil {
		br.ctx = r.tracer.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
	}
	var fresh []*pgconn.StatementDescription
	br.sds, fresh = r.lookup(b, br.sdsBuf[:0])
	pipe := conn.PgConn().StartPipeline(br.ctx)
	if err := r.prepare(pipe, conn, fresh); err != nil {
		pipe.Close()
		return br.early(err)
	}
	formats := br.formatsBuf[:0]
	for i, q := range b.QueuedQueries {
		sd := br.sds[i]
		if err := r.eqb.Build(conn.TypeMap(), sd, q.Arguments); err != nil {
			pipe.Close() // unsynced requests: pgconn closes the connection, as in pgx
			return br.early(fmt.Errorf("build statement %d of the batch: %w", i, err))
		}
		if r.named {
			// pgconn keeps the result formats until the results are read; Build reuses
			// its slices. Each statement's are a segment of formats, which only grows.
			n := len(formats)
			formats = append(formats, r.eqb.ResultFormats...)
			pipe.SendQueryStatement(sd, r.eqb.ParamValues, r.eqb.ParamFormats, formats[n:len(formats):len(formats)])
		} else {
			pipe.SendQueryParams(sd.SQL, r.eqb.ParamValues, sd.ParamOIDs, r.eqb.ParamFormats, r.eqb.ResultFormats)
		}
	}
	if err := pipe.Sync(); err != nil {
		pipe.Close()
		return br.early(err)
	}
	br.pipe = pipe
	return br
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
func (r *registry) prepare(pipe *pgconn.Pipeline, conn *pgx.Conn, fresh []*pgconn.StatementDescription) (err error) {
	if len(fresh) == 0 {
		return nil
	}
	closing := r.stale
	defer func() {
		if err != nil {
			for _, sd := range fresh {
				if sd.Name != "" {
					r.stale = append(r.stale, sd.Name) // some may have been prepared
				}
			}
		}
	}()
	if st := conn.PgConn().TxStatus(); st != 'I' && st != 'T' {
		closing = nil // an aborted transaction: close them later
	}
	for _, name := range closing {
		pipe.SendDeallocate(name)
	}
	for _, sd := range fresh {
		pipe.SendPrepare(sd.Name, sd.SQL, nil)
	}
	if err := pipe.Sync(); err != nil {
		return err
	}
	for range closing {
		if _, err := expect[*pgconn.CloseComplete](pipe); err != nil {
			return err
		}
	}
	r.stale = r.stale[len(closing):]
	for _, sd := range fresh {
		got, err := expect[*pgconn.StatementDescription](pipe)
		if err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
		sd.ParamOIDs, sd.Fields = got.ParamOIDs, got.Fields
	}
	if _, err := expect[*pgconn.PipelineSync](pipe); err != nil {
		return err
	}
	for _, sd := range fresh {
		r.add(sd)
	}
	return nil
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
