package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/keytable"
)

// Pool is what the services need of a connection pool; *pgxpool.Pool satisfies it.
type Pool interface {
	keytable.DBTX
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Env is what every service is handed: the engine's values, never the engine.
type Env struct {
	// Store runs the services' statements on the key table.
	Store *keytable.Store
	// Pool is the engine's pool; each statement takes a connection of its own.
	Pool Pool
	// StatementTimeout bounds each statement a service sends, so that a connection
	// that stops answering cannot hold a background loop (the engine's lease).
	StatementTimeout time.Duration
	// Logger receives what the services log: a pass's results and warnings.
	Logger *slog.Logger
}

// bounded is ctx bounded by the statement timeout.
func (e *Env) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.StatementTimeout)
}

// Stopped reports whether ctx ended or stop (nil: never) was closed: a service then
// starts nothing new.
func Stopped(ctx context.Context, stop <-chan struct{}) bool {
	if ctx.Err() != nil {
		return true
	}
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
