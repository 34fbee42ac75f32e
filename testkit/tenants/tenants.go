// Package tenants is a test fixture for "a transaction ends with its phase": a pool of
// ONE connection shared by two tenants, a and b, and an engine on it whose flow "notes"
// runs one tx phase that writes the tenant's note and then does what the tenant's test
// asks (keep the transaction, hold the phase open, ...). With one connection, whatever
// tenant a's kept transaction could still send would run on the connection tenant b's
// phase is using.
//
// Part of idemflow's test-support tree (testkit/): no compatibility promise. Used by
// workflow's tests and by the reliability module's River test.
package tenants

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// Setup is the fixture.
type Setup struct {
	DB     *pgtest.DB
	Pool   *pgxpool.Pool // MaxConns 1
	Engine *workflow.Engine
	// Phase is what each tenant's phase does after writing its note.
	Phase map[string]func(ctx context.Context, tx phases.DBTX) (*phases.Response, error)
}

// New makes the fixture in a schema of its own.
func New(t *testing.T) *Setup {
	t.Helper()
	ctx := context.Background()
	s := &Setup{DB: pgtest.New(t), Phase: map[string]func(context.Context, phases.DBTX) (*phases.Response, error){}}
	_, err := s.DB.Pool.Exec(ctx, `CREATE TABLE notes (name text PRIMARY KEY)`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(s.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	s.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(s.Pool.Close)
	// One connection for every tenant: admission waits as long as the caller's context
	// (AdmitWait -1), so that a busy machine's slow queue is not shed as overload.
	s.Engine, err = workflow.New(s.Pool, &workflow.Config{AdmitWait: -1})
	require.NoError(t, err)
	require.NoError(t, s.Engine.Register(phases.Flow{Name: "notes", Phases: []phases.Phase{
		phases.Tx("write", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO notes (name) VALUES ($1)`, run.Scope()); err != nil {
				return nil, err
			}
			return s.Phase[run.Scope()](ctx, tx)
		}),
	}}))
	return s
}

// Req is tenant's request to the flow "notes".
func Req(tenant string) workflow.Request {
	return workflow.Request{Scope: tenant, Key: "k", Flow: "notes", Method: "POST", Route: "/notes", Body: []byte(`{}`)}
}

// Notes returns the notes committed, in name order.
func (s *Setup) Notes(t *testing.T) []string {
	t.Helper()
	rows, err := s.DB.Pool.Query(context.Background(), `SELECT name FROM notes ORDER BY name`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// Created answers 201, as a tenant's phase that is done.
func Created(context.Context, phases.DBTX) (*phases.Response, error) {
	return phases.JSON(201, map[string]string{"ok": "yes"})
}

// WhileBHolds runs tenant b's request, whose phase holds the pool's only connection in
// its open transaction while late runs, then lets b's phase answer; b must succeed.
func (s *Setup) WhileBHolds(t *testing.T, late func()) {
	t.Helper()
	inTx, release := make(chan struct{}), make(chan struct{})
	s.Phase["b"] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
		close(inTx)
		<-release
		return Created(ctx, tx)
	}
	done := make(chan error, 1)
	go func() {
		res, err := s.Engine.Do(context.Background(), Req("b"))
		if err == nil && res.Response.Status != 201 {
			err = errors.New("b was not answered 201")
		}
		done <- err
	}()
	<-inTx
	// A failing check in late ends the test's goroutine: b's phase is let go all the
	// same, so that the test ends rather than hang.
	released := false
	defer func() {
		if !released {
			close(release)
			<-done
		}
	}()
	late()
	released = true
	close(release)
	require.NoError(t, <-done, "tenant b's request")
}
