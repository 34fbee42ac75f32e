package workflow

// Defaults of the sweep options, for TestSweepDefaultsMatchTheSweeper.
const (
	SweepGraceDefault       = sweepGraceDefault
	SweepMaxAttemptsDefault = maxAttemptsDefault
)
