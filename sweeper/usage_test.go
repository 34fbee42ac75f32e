package sweeper_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/workflow"
)

// usage holds the package documentation's snippets, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, engine *workflow.Engine, done <-chan struct{}) error {
	if err := engine.Start(ctx, nil); err != nil { // nil: the engine's Config.Sweeper; returns at once
		return err
	}
	<-done // until the process shuts down
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := engine.Stop(stopCtx); err != nil { // lets in-flight keys finish, returns the rest
		return err
	}

	stats, err := engine.Sweep(ctx, &workflow.SweeperConfig{Grace: -1}) // one pass, synchronously: for tests and operators
	fmt.Println(stats, err)
	return err
}

var _ = usage
