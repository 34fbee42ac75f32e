package sweeper_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

// usage holds the package documentation's snippets, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, engine *workflow.Engine, done <-chan struct{}) error {
	sw, err := sweeper.New(engine, nil) // nil *Config: all defaults
	if err != nil {
		return err
	}
	if err := sw.Start(ctx); err != nil { // returns at once
		return err
	}
	<-done // until the process shuts down
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sw.Stop(stopCtx); err != nil { // lets in-flight keys finish, returns the rest
		return err
	}

	stats, err := sw.RunOnce(ctx) // one pass, synchronously: for tests and operators
	fmt.Println(stats, err)
	return err
}

var _ = usage
