// Package attempt is the executor of one attempt on a key: it runs a flow's phases
// from the key's recovery point as the holder of the key's lease, a tx phase as one
// plan (head: the claim of a new key, the fence of an existing one, or nothing; body:
// the phase's Go code or its queued statements; one write of the key row; tail: COMMIT
// or the implicit end), a call phase between transactions, and ends the attempt by
// storing the answer, releasing the key or dead-letterring it.
//
// It is handed an Env of the few values it reads (the key table's driver, the pool,
// the engine's admission and hooks, the sealer, the settings it obeys), never the
// engine. Package workflow makes one Env per engine and one Exec per attempt:
//
//	x := attempt.Fresh(env, flow, claim, req.Body, sealed) // a new key
//	end := x.Drive(ctx, 0)
//	if !end.Lost {
//		return x.Keyed(end.Out)
//	}
//
// and attempt.Take(env, flow, row, started, attempt.Taken{...}) for a key whose lease
// was taken over. The files, top-down: exec.go (the attempt, phase by phase, and how
// it ends), plan.go (a tx phase's transaction as one plan, sent in one place),
// pipeline.go (a pipelined phase's body), tx.go and txpgx.go (the pgx.Tx a Go-code
// phase gets), sqltext.go (the checks of a phase's statement texts), drain.go,
// standby.go and history.go (what the drain, the standby wait and the key's history
// need of an attempt), and compensate.go (a cancel's compensation, in the cancel's
// own transaction).
//
// # Imports
//
// It imports internal/keytable, internal/pgpipe, internal/pipestate,
// internal/runstate, internal/vocab and phases, and none of idemflow's other public
// packages.
package attempt
