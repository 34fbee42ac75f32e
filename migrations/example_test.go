package migrations_test

import (
	"context"
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
)

// Migrate brings the pool's schema to the newest version this build knows, and is a
// no-op when it is there already (pgtest.Example has run it once).
func ExampleMigrate() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if err := migrations.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	all, err := migrations.All()
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := migrations.Version(ctx, pool)
	fmt.Println(v == all[len(all)-1].Version, err)
	// Output: true <nil>
}
