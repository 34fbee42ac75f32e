package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/migrations"
)

// On a Citus coordinator (-db naming a database with the citus extension) the bench
// works in a fresh schema of that database, migrates it as anywhere else and then
// distributes the charges table (by account_id) and idemflow_keys (by scope) in one
// colocation group, as docs/SCALING.md tells applications to: every statement of a
// charges request then runs on the one shard that holds its scope. The hand-written
// recipes' key tables have a serial primary key, which Citus cannot distribute, and
// their statements join them to charges: they stay plain coordinator tables and the
// recipes do not run there unless -only names them. The server's CPU and WAL columns
// are the coordinator's only (the workers are other servers).

// citusVariants run on Citus when -only names none.
var citusVariants = []string{vBare, vIdem, vReplay}

// hasCitus reports whether the bench should distribute its tables: mode "on" requires
// the citus extension in the database serverURL names, "auto" looks for it, "off"
// never distributes.
func hasCitus(ctx context.Context, serverURL, mode string) (bool, error) {
	if mode == "off" {
		return false, nil
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return false, fmt.Errorf("connect to %s: %w", redactURL(serverURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var has bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").Scan(&has); err != nil {
		return false, fmt.Errorf("look for the citus extension: %w", err)
	}
	if mode == "on" && !has {
		return false, fmt.Errorf("-distribute on: %w", migrations.ErrNoCitus)
	}
	return has, nil
}

// distribute makes charges and idemflow_keys distributed tables of one colocation
// group, and restricts the rounds to the variants that run on Citus.
func (e *env) distribute(ctx context.Context) error {
	err := migrations.Distribute(ctx, e.check, &migrations.DistributeOptions{
		ColocateWith: "charges",
		Tables:       []migrations.Table{{Name: "charges", Column: "account_id"}},
	})
	if err != nil {
		return fmt.Errorf("distribute the key and charges tables: %w", err)
	}
	var n int
	if err := e.check.QueryRow(ctx, `SELECT count(DISTINCT colocationid) FROM pg_dist_partition
		WHERE logicalrelid IN ('charges'::regclass, 'idemflow_keys'::regclass)`).Scan(&n); err != nil {
		return fmt.Errorf("read Citus's metadata: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("charges and idemflow_keys are in %d colocation groups, want 1", n)
	}
	if len(e.o.only) == 0 {
		e.o.only = slices.Clone(citusVariants)
	}
	logf("Citus: charges and idemflow_keys distributed by scope, colocated; variants %v", e.o.only)
	return nil
}

// runs reports whether the rounds run variant name (-only, or Citus's default).
func (o *options) runs(name string) bool {
	return len(o.only) == 0 || slices.Contains(o.only, name)
}
