package idemflowtest_test

import (
	"fmt"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/phases"
)

// The boundaries a crash matrix kills an attempt at come from the flow's phases.
func ExampleBoundaries() {
	flow := phases.Flow{Name: "refund", Phases: []phases.Phase{
		phases.Tx("hold", nil),
		phases.Call("refund", nil),
		phases.Tx("record", nil),
	}}
	for _, b := range idemflowtest.Boundaries(flow) {
		fmt.Println(b)
	}
	// Output:
	// hold/after-claim
	// hold/before-commit
	// hold/after-commit
	// refund/before-call
	// refund/after-call
	// record/before-commit
	// record/after-commit
	// finished
}
