package sweeper

import (
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflow"
)

// Defaults for Config.
//
// Deprecated: use workflow's (SweepIntervalDefault, SweepGraceDefault,
// SweepBatchSizeDefault, SweepConcurrencyDefault, SweepMaxAttemptsDefault,
// RetentionDefault, CleanupBatchDefault, CleanupShareDefault, DeadRetentionDefault,
// ParkedRetentionDefault). These names go in the next minor release.
const (
	IntervalDefault        = workflow.SweepIntervalDefault
	GraceDefault           = workflow.SweepGraceDefault
	BatchSizeDefault       = workflow.SweepBatchSizeDefault
	ConcurrencyDefault     = workflow.SweepConcurrencyDefault
	MaxAttemptsDefault     = workflow.SweepMaxAttemptsDefault
	RetentionDefault       = workflow.RetentionDefault
	CleanupBatchDefault    = workflow.CleanupBatchDefault
	CleanupShareDefault    = workflow.CleanupShareDefault
	DeadRetentionDefault   = workflow.DeadRetentionDefault
	ParkedRetentionDefault = workflow.ParkedRetentionDefault
)

// Config configures an engine's sweeper.
//
// Deprecated: use workflow.SweeperConfig (or workflow.Config.Sweeper); this alias goes
// in the next minor release.
type Config = workflow.SweeperConfig

// Hooks observe an engine's sweeper.
//
// Deprecated: use workflow.SweeperHooks; this alias goes in the next minor release.
type Hooks = workflow.SweeperHooks

// Stats counts what one pass did.
//
// Deprecated: use workflow.SweepStats; this alias goes in the next minor release.
type Stats = workflow.SweepStats

// PartitionStats is what a pass did to a partitioned key table: the one partition
// report, store.PartitionReport.
//
// Deprecated: use store.PartitionReport; this alias goes in the next minor release.
type PartitionStats = store.PartitionReport
