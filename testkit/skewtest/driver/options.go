package main

import (
	"os"

	"github.com/idemflow/idemflow/workflow"
)

// options sets in c the settings of this tree that the previous release does not have,
// from the environment; the skew test builds the previous release with previousOptions
// in this file's place.
func options(c *workflow.Config) {
	c.HistoryOmitCleanFinish = os.Getenv("SKEW_HISTORY_OMIT") == "1"
}
