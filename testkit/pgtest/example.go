package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/migrations"
)

// Example makes a fresh, migrated schema on the shared test server for a testable
// example (which has no *testing.T) and returns a pool on it and a function that closes
// the pool and drops the schema. Applications pass their own pool to workflow.New after
// running migrations.Migrate once.
func Example(ctx context.Context) (*pgxpool.Pool, func(), error) {
	srv, err := Shared(ctx)
	if err != nil {
		return nil, nil, err
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := pgx.Identifier{"example_" + hex.EncodeToString(b)}.Sanitize()
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, srv.URL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE SCHEMA " + schema); err != nil {
		return nil, nil, err
	}
	drop := func() { _ = exec("DROP SCHEMA " + schema + " CASCADE") }
	cfg, err := pgxpool.ParseConfig(srv.URL)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, err
	}
	err = migrations.Migrate(ctx, pool)
	if err == nil && CitusMode() {
		err = migrations.Distribute(ctx, pool, testColocation)
	}
	if err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}
