package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/workflow"
)

// erase deletes every key of a scope: `keys erase -scope S`. Without -yes it only
// counts (a dry run) and fails, saying how to go on; -dry-run counts and succeeds.
func (c *cli) erase(ctx context.Context, args []string) error {
	fs, asJSON := flags("keys erase")
	scope := fs.String("scope", "", "the scope whose keys are erased (required)")
	force := fs.Bool("force", false, "erase the keys in progress too, fencing their holders")
	dry := fs.Bool("dry-run", false, "count the keys that would be erased; change nothing")
	yes := fs.Bool("yes", false, "erase (without it, the keys are only counted)")
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	if *scope == "" {
		return badUsage("keys erase: -scope is required: the scope whose keys are erased")
	}
	if *dry && *yes {
		return badUsage("keys erase: -dry-run and -yes together: choose one")
	}
	opts := workflow.EraseOptions{Force: *force, DryRun: !*yes}
	res, err := c.engine.EraseScope(ctx, *scope, opts)
	switch {
	case errors.Is(err, workflow.ErrInvalidScope):
		return badUsage("keys erase: %v", err)
	case err != nil:
		if res.Erased > 0 {
			return fmt.Errorf("keys erase: %d keys erased before: %w", res.Erased, err)
		}
		return err
	}
	if *asJSON {
		if err := c.json(res); err != nil {
			return err
		}
	} else {
		c.eraseReport(*scope, opts, res)
	}
	if !*yes && !*dry && res.Erased > 0 {
		return fmt.Errorf("keys erase: nothing done: %d keys of scope %q would be erased; run again with -yes to erase them", res.Erased, *scope)
	}
	return nil
}

// eraseReport prints what an erasure did or would do.
func (c *cli) eraseReport(scope string, opts workflow.EraseOptions, res workflow.EraseResult) {
	q := fmt.Sprintf("%q", scope)
	if opts.DryRun {
		fmt.Fprintf(c.out, "would erase %d keys of scope %s (dry run: nothing changed)\n", res.Erased, q)
		if res.Fenced > 0 {
			fmt.Fprintf(c.out, "%d of them are leased by a live attempt, which would be fenced\n", res.Fenced)
		}
	} else {
		fmt.Fprintf(c.out, "erased %d keys of scope %s\n", res.Erased, q)
		if res.Fenced > 0 {
			fmt.Fprintf(c.out, "%d of them were leased by a live attempt, now fenced: a call it had under way may still reach the remote side\n", res.Fenced)
		}
	}
	if res.Left > 0 {
		fmt.Fprintf(c.out, "%d keys in progress left: let them finish and erase again, or add -force\n", res.Left)
	}
}
