package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/testkit/pgtest"
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
	e.machine.citus = true
	if len(e.o.only) == 0 {
		e.o.only = slices.Clone(citusVariants)
	}
	logf("Citus: charges and idemflow_keys distributed by scope, colocated; variants %v", e.o.only)
	return nil
}

// startCitus starts a throwaway cluster for -citus and returns its coordinator's URL;
// the workers' CPU is read with the coordinator's.
func (e *env) startCitus(ctx context.Context) (string, error) {
	logf("starting a throwaway Citus cluster (a coordinator and its workers)")
	c, err := pgtest.StartCitus(ctx)
	if err != nil {
		return "", err
	}
	e.cluster = c
	e.machine.citusNodes = 1 + len(c.Workers)
	for _, w := range c.Workers {
		conn, err := pgx.Connect(ctx, w.URL)
		if err != nil {
			return "", fmt.Errorf("connect to a worker: %w", err)
		}
		e.nodes = append(e.nodes, cpumeter.New(ctx, conn))
		conn.Close(ctx)
	}
	return c.Coordinator.URL, nil
}

// readCPU reads the client's and the server's CPU: the server's is every node's that
// the bench can see (the coordinator's, and a -citus cluster's workers').
func (e *env) readCPU(end bool) cpumeter.Times {
	t := e.cpu.Read(end)
	for _, m := range e.nodes {
		t.Server += m.Read(end).Server
	}
	return t
}

// runs reports whether the rounds run variant name (-only, or Citus's default).
func (o *options) runs(name string) bool {
	return len(o.only) == 0 || slices.Contains(o.only, name)
}
