// Package store is idemflow's driver layer as a user sees it: the key table's layout.
// The engine (package workflow) runs its own statements on the key table and needs
// nothing from here; a deployment imports store only to move the key table to the
// partitioned layout and to keep its partitions (docs/PARTITIONS.md):
//
//	st := store.New() // or store.NewInSchema(schema), as workflow.Config.Schema
//	err := st.SetupPartitioned(ctx, pool, store.PartitionDay, 0)
//
// then EnsurePartitions and RemovePartitions, which the sweeper runs on every pass
// (with sweeper.Config.Retention), Partitions to list them and CheckPartitions to
// see how many exist ahead. Its errors are the layout's own (ErrNotPartitioned,
// ErrNotEmpty, ErrLiveKeysInDetached); the errors of the database (unavailable,
// refused, a conflict) are named once, in workflow (workflow.ErrUnavailable, ...).
//
// The statements themselves, and the translation of pgx errors into the errors above
// and workflow's, live in one internal package of this module; store runs no SQL of
// its own. It may import the standard library, pgx and that package, and none of
// idemflow's public packages.
package store
