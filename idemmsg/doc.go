// Package idemmsg runs idemflow flows for messages instead of HTTP requests: a
// consumer of a queue or log with at-least-once delivery (NATS JetStream, Kafka, SQS,
// a River job) hands each delivery to Handle and does what the Decision says. A
// message redelivered after a crash, a lost ack or a duplicate publish then has one
// effect: the first delivery runs the flow, later ones replay its stored answer, and
// one that arrives while another delivery runs it is told to come back later.
//
// A message is a request without a method or a route: its Key (the message id, or a
// business key from the payload) is the idempotency key, its Scope (the consumer's
// identity or the tenant) owns the key, and its Payload is the body that is
// fingerprinted, stored for resumption and given to the phases as run.Body(). The
// package fills the request's method and route with constants of its own (Method,
// Route), which no request through package idemhttp has, so a message and an HTTP
// request never share a fingerprint. A redelivery with the same key and another payload is a
// mismatch, answered Terminate: the consumer decides whether to dead-letter or alert.
//
// Usage, in a consumer's loop:
//
//	d := idemmsg.Handle(ctx, engine, idemmsg.Message{
//		Scope: "payouts", Key: msg.ID, Flow: "payout", Payload: msg.Data,
//	})
//	switch d.Action {
//	case idemmsg.Ack: // finished (d.Result.Replayed for a replay): ack
//	case idemmsg.Retry: // in progress or transient: redeliver after d.Delay
//	case idemmsg.Terminate: // mismatch, invalid or dead-lettered: never redeliver
//	}
//
// Ack only on Ack, and only after Handle returned: a message acked before its
// answer is stored is lost if the process dies, and a message never acked is
// redelivered and replayed, never run twice. A key left unfinished by a delivery that
// died is finished by a sweeper (package sweeper) even if the broker never
// redelivers it.
//
// A delivery that finds its key held by another delivery is not held to wait for its
// answer (workflow.Request.Wait is never set): it is answered Retry with a Delay from
// the flow's observed answer time (workflow.InProgressError.RetryAfter), and the
// broker redelivers it then. A wait would keep the delivery in flight: it takes one of
// the consumer's unacknowledged slots (JetStream's MaxAckPending, SQS's in-flight
// limit), runs against the broker's ack deadline (AckWait, visibility timeout), which
// would have to outlast every wait, and on an ordered log (a Kafka partition) holds up
// every later message behind it. A delayed redelivery holds nothing in the process,
// survives the consumer's own crash, and costs one broker round trip; no one is
// waiting on the other end for an answer, which is what the HTTP wait is for.
//
// This package imports idemflow's workflow package.
package idemmsg
