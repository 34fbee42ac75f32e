package workflow

import "github.com/idemflow/idemflow/internal/maintenance"

// Defaults of the takeover service's options (zero in TakeDueOpts and RunOpts), for
// TestSweepDefaultsMatchTheSweeper.
const (
	TakeoverGraceDefault       = maintenance.GraceDefault
	TakeoverMaxAttemptsDefault = maintenance.MaxAttemptsDefault
)
