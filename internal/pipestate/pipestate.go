// Package pipestate is what a pipelined tx phase's builder declares, as the engine
// reads it: the statements with their result callbacks, and the function that decides
// the phase's answer from them.
//
// A phases.Pipeline is a Pipeline (package phases declares
// `type Pipeline pipestate.Pipeline[*Run, *Response]`), so the engine converts between
// the two and reads what was declared with no accessor on phases.Pipeline's API, as it
// does for runstate.Run.
//
// This package imports none of idemflow's packages.
package pipestate

import "github.com/jackc/pgx/v5"

// Pipeline is a pipelined phase's declaration. R is the run a Then function gets, S
// the response it returns.
type Pipeline[R, S any] struct {
	batch pgx.Batch
	then  func(run R) (S, error)
}

// Queue adds a statement.
func (p *Pipeline[R, S]) Queue(sql string, args []any) *pgx.QueuedQuery {
	return p.batch.Queue(sql, args...)
}

// SetThen sets the function that decides the answer.
func (p *Pipeline[R, S]) SetThen(fn func(run R) (S, error)) { p.then = fn }

// Statements are the statements queued, in order.
func (p *Pipeline[R, S]) Statements() []*pgx.QueuedQuery { return p.batch.QueuedQueries }

// Then is the function set by SetThen, or nil.
func (p *Pipeline[R, S]) Then() func(run R) (S, error) { return p.then }
