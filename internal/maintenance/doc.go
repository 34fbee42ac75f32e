// Package maintenance holds the engine's maintenance services, one a file, each with
// its settings and one RunOnce that does one pass of its work: Takeover (take over due
// keys and run them through the executor), Expirer (delete finished, dead-lettered and
// parked keys past their retention) and Partitioner (create partitions ahead, remove
// those past retention). The engine's sweeper (workflow.Engine.Start, Stop, Sweep)
// builds them from its configuration and runs them in turn, each pass.
//
// A service is handed an Env of the few values it needs (the Store, the pool, the
// statement bound, the logger) and, for the takeover, the executor as one function
// value (RunFunc); it never sees the engine.
//
// Usage (from package workflow):
//
//	env := &maintenance.Env{Store: st, Pool: pool, StatementTimeout: lease, Logger: log}
//	ex := &maintenance.Expirer{Env: env, ClientOnly: clientOnlyFlows,
//		Config: maintenance.ExpirerConfig{Finished: 24 * time.Hour, Dead: -1, Parked: -1, Batch: 1000, Share: 0.5}}
//	expired, err := ex.RunOnce(ctx, nil) // nil: no stop channel
//
// # Imports
//
// It imports internal/keytable and none of idemflow's public packages.
package maintenance
