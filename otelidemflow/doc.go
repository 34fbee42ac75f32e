// Package otelidemflow observes an idemflow engine with OpenTelemetry: a span per
// attempt with a child span per phase, metrics of attempts, outcomes, phases and key
// events, and gauges of the keys in progress, stuck and dead-lettered. The engine
// itself knows nothing of OpenTelemetry; this package is a set of workflow.Hooks.
//
//	obs, err := otelidemflow.New(&otelidemflow.Config{TracerProvider: tp, MeterProvider: mp})
//	if err != nil {
//		return err
//	}
//	engine, err := workflow.New(pool, &workflow.Config{Hooks: workflow.JoinHooks(obs.Hooks(), myHooks)})
//	if err != nil {
//		return err
//	}
//	reg, err := obs.ObserveKeys(engine) // the gauges; reg.Unregister() stops them
//	if err != nil {
//		return err
//	}
//	err = engine.Start(ctx, &workflow.SweeperConfig{Hooks: obs.SweeperHooks()}) // the sweeper's liveness
//
// Traces. Each attempt (a call of Do or Resume, a sweeper's run of a key) is a span
// named "idemflow.attempt <flow>", a child of the context passed to Do (an HTTP
// server span, say); each phase run is a child span "idemflow.phase <phase>". The
// trace context of the attempt that claims a new key is stored with the key (its
// origin, in the write that creates the row, as a W3C traceparent), so that a later
// attempt on the key — the client's retry, a sweeper finishing the work — carries a
// span link to the original request's span: in a trace viewer, the sweep that
// finished a charge points back to the request that started it. A sweeper's attempt
// is the root span of a trace of its own (a sweeper pass makes no span); put the HTTP
// server behind otelhttp and a request's attempt is a child of its server span.
//
// Span attributes: idemflow.flow, idemflow.executor (client, sweeper),
// idemflow.key.id (the key row's id, never the client's key unless
// Config.RecordKeys), idemflow.attempt, idemflow.outcome, idemflow.phase,
// idemflow.phase.kind, idemflow.recovery_point, and idemflow.derived_key on call
// phases when Config.RecordDerivedKeys is set. Failed attempts and phases have status
// Error and error.type set to their outcome (OpenTelemetry's semantic convention for
// errors); a 409, a 422 or a replay is an answer, not an error.
//
// Metrics, all with the attribute idemflow.flow:
//
//   - idemflow.attempts (counter): attempts by idemflow.executor (client, sweeper) and
//     idemflow.outcome: finished, replayed, in_progress (a 409), mismatch (a 422),
//     released (a transient failure), dead_lettered, lease_lost, parked, failed.
//   - idemflow.attempt.duration (histogram, seconds): the same attempts' durations.
//   - idemflow.phase.duration (histogram, seconds): phase runs by idemflow.phase,
//     idemflow.phase.kind (tx, call) and idemflow.phase.outcome (ok, error); a tx
//     phase's includes its commit.
//   - idemflow.key.events (counter): key events by idemflow.event, in the vocabulary
//     of idemflow.outcome (workflow.Outcome): an attempt's claimed, taken_over (by a
//     retry), waiting and its end (finished, replayed, in_progress, mismatch,
//     released, dead_lettered, lease_lost, parked); swept and given_back (a sweeper's
//     takeover and its return of a key unrun); redriven, operator_released,
//     operator_cancelled and purged (an operator's); layout_unknown (the engine's
//     check of the key table's layout failed; flow empty).
//   - idemflow.keys (gauge): unfinished keys by idemflow.key.status: in_progress
//     (not stuck), stuck, dead; the statuses do not overlap, and each flow reads 0
//     when it has none.
//   - idemflow.keys.oldest_due (gauge, seconds): how long the longest-waiting stuck
//     key has been due for a sweeper; 0 when none is stuck.
//   - idemflow.sweeper.last_pass (gauge, Unix seconds, no attribute): when this
//     process's sweeper last completed a pass, fed by SweeperHooks (pass them as
//     sweeper.Config.Hooks); a sweeper that died or hangs stops moving it.
//
// The gauges are read by one indexed query per collection (ObserveKeys), never per
// request.
//
// docs/OPERATIONS.md says what to alert on; deploy/ holds Prometheus alerting rules
// and a Grafana dashboard for these metrics.
//
// This package imports idemflow's workflow and sweeper packages.
package otelidemflow
