package reliability

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// ranAfter is a child's pgx tracer: it counts the statements of the flows' own code
// (any statement but the engine's on the key table and transaction control) sent after
// the child's point fired that the server ran without error. A zombie resumed after its
// key was taken over must run none: its next tx phase's fence check refuses it before
// its first statement, and a transaction it left open commits nothing new. A statement
// of a round trip sent before the point (a folded claim's first statement, whose result
// is read after its after-claim point) ran before it, and is not counted.
type ranAfter struct {
	fired atomic.Bool
	n     atomic.Int64
}

type (
	ranSQL    struct{}
	sentEarly struct{} // the statement or batch was sent before the point fired
)

func (r *ranAfter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(r.mark(ctx), ranSQL{}, d.SQL)
}

func (r *ranAfter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(ranSQL{}).(string); d.Err == nil && ctx.Value(sentEarly{}) == nil {
		r.count(sql)
	}
}

func (r *ranAfter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return r.mark(ctx)
}

func (r *ranAfter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if d.Err == nil && ctx.Value(sentEarly{}) == nil {
		r.count(d.SQL)
	}
}

// mark marks ctx as a request sent before the point fired, if it was.
func (r *ranAfter) mark(ctx context.Context) context.Context {
	if r.fired.Load() {
		return ctx
	}
	return context.WithValue(ctx, sentEarly{}, true)
}

func (r *ranAfter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// takeDuePlan starts the planner settings a sweeper's takeover sends in its own
// transaction, ahead of the takeover statement (keytable's sqlTakeDuePlan): the
// engine's statement, not a flow's, though it names no table.
const takeDuePlan = "SELECT set_config('enable_seqscan'"

func (r *ranAfter) count(sql string) {
	if !r.fired.Load() || strings.Contains(sql, "idemflow_keys") || strings.HasPrefix(sql, takeDuePlan) {
		return
	}
	switch strings.ToUpper(strings.Fields(sql + " x")[0]) {
	case "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE":
		return
	}
	r.n.Add(1)
}
