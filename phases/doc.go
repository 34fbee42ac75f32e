// Package phases holds the building blocks a flow is written with: tx phases that run in
// one local transaction, call phases that reach outside the database with a derived key,
// typed phase data carried from phase to phase, and the outcomes a phase can return.
//
// A flow is an ordered list of phases with stable names:
//
//	var chargeID = phases.NewSlot[int64]("charge_id")
//
//	flow := phases.Flow{Name: "create_charge", Phases: []phases.Phase{
//		phases.Tx("create_charge", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
//			var id int64
//			err := tx.QueryRow(ctx, `INSERT INTO charges (amount) VALUES ($1) RETURNING id`, 500).Scan(&id)
//			if err != nil {
//				return nil, err
//			}
//			return nil, chargeID.Set(run, id) // nil response: go on to the next phase
//		}),
//		phases.Call("provider_charge", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
//			// run.DerivedKey() is the same on every retry and in the sweeper.
//			return nil, provider.Charge(ctx, run.DerivedKey(), 500)
//		}),
//		phases.Tx("finalize", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
//			id, err := chargeID.Get(run)
//			if err != nil {
//				return nil, err
//			}
//			return phases.JSON(201, map[string]int64{"id": id}) // a response finishes the key
//		}),
//	}}
//
// What a phase function returns decides what happens next:
//
//   - (nil, nil): the phase succeeded; the engine moves on to the next phase.
//   - (resp, nil) with a status below 500: the key is finished with resp, committed in
//     the same transaction as a tx phase's writes.
//   - an error made by Fail (or FailProblem): the key is finished with that response; a
//     tx phase's writes are rolled back.
//   - any other error, a panic or a response of 5xx: transient. Nothing is stored, the
//     key is released with its recovery point kept, and the work resumes from there on
//     the next attempt. RetryAfter suggests when.
//
// JSON and Problem (application/problem+json, RFC 9457) make answers in one call; a
// failure answered as problem details is one call too:
//
//	return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
//
// A flow whose phases each need the request decodes it once per attempt with a Body:
//
//	var request = phases.NewBody(parseCharge) // func([]byte) (Charge, error)
//
//	req, err := request.Get(run) // in each phase: the attempt's first decoding
//
// The package example compiles this flow.
//
// This package imports none of idemflow's other packages except internal/runstate: a
// Run is a runstate.Run, through which the engine (and only the engine) makes runs,
// enters phases and undoes a failed phase's data changes. None of that is on Run, so a
// phase function cannot change its own derived key.
package phases
