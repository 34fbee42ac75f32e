package store_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// setUp is the usage block of the package's documentation, compiled: move an empty
// key table to day partitions, then let the engine's sweeper keep them.
func setUp(ctx context.Context, pool *pgxpool.Pool) error {
	st := store.New() // or store.NewInSchema(schema), as workflow.Config.Schema
	err := st.SetupPartitioned(ctx, pool, store.PartitionDay, 0)
	return err
}

// Moving an empty key table to the partitioned layout (no output: it needs a server).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := setUp(ctx, pool); err != nil {
		log.Fatal(err)
	}
}
