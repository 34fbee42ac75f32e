package migrations_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/migrations"
)

// usage holds the package documentation's snippet, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrations.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

var _ = usage
