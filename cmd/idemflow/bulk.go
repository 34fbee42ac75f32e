package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idemflow/idemflow/workflow"
)

// bulk re-drives or releases every key that matches a filter: `keys bulk redrive|release`.
// Without -yes it only counts (a dry run) and fails, saying how to go on; -dry-run
// counts and succeeds.
func (c *cli) bulk(ctx context.Context, args []string) error {
	fs, asJSON := flags("keys bulk")
	var o workflow.BulkOptions
	fs.StringVar(&o.Flow, "flow", "", "only keys of this flow")
	fs.StringVar(&o.Scope, "scope", "", "only keys of this scope")
	fs.StringVar(&o.RecoveryPoint, "recovery-point", "", "only keys at this recovery point")
	fs.StringVar(&o.ErrorContains, "error", "", "only keys whose last error contains this text")
	fs.BoolVar(&o.All, "all", false, "with no other filter: every key of the action's status")
	fs.IntVar(&o.Limit, "limit", workflow.BulkLimitDefault, fmt.Sprintf("most keys acted on, 1..%d", workflow.BulkLimitMax))
	dry := fs.Bool("dry-run", false, "count the keys that would be acted on; change nothing")
	yes := fs.Bool("yes", false, "act (without it, the keys are only counted)")
	if err := parse(fs, args, 1, "redrive or release"); err != nil {
		return err
	}
	o.Action = workflow.BulkAction(fs.Arg(0))
	if o.Action != workflow.BulkRedrive && o.Action != workflow.BulkRelease {
		return badUsage("keys bulk: want redrive or release, got %q", fs.Arg(0))
	}
	if o.Limit < 1 || o.Limit > workflow.BulkLimitMax {
		return badUsage("keys bulk: -limit %d is outside 1..%d", o.Limit, workflow.BulkLimitMax)
	}
	if *dry && *yes {
		return badUsage("keys bulk: -dry-run and -yes together: choose one")
	}
	o.DryRun = !*yes
	res, err := c.engine.BulkKeys(ctx, o)
	switch {
	case errors.Is(err, workflow.ErrEmptyFilter):
		return badUsage("keys bulk: no filter: give -flow, -scope, -recovery-point or -error, or -all for every key")
	case errors.Is(err, workflow.ErrInvalidRequest):
		return badUsage("keys bulk: %v", err)
	case err != nil:
		return err
	}
	if *asJSON {
		if err := c.json(res); err != nil {
			return err
		}
	} else {
		c.bulkReport(o, res)
	}
	if !*yes && !*dry && res.Matched > 0 {
		return fmt.Errorf("keys bulk: nothing done: %d keys match; run again with -yes to %s them", res.Matched, o.Action)
	}
	return nil
}

// bulkReport prints what a bulk action did or would do.
func (c *cli) bulkReport(o workflow.BulkOptions, res workflow.BulkResult) {
	past := map[workflow.BulkAction]string{workflow.BulkRedrive: "re-drove", workflow.BulkRelease: "released"}[o.Action]
	if o.DryRun {
		fmt.Fprintf(c.out, "would %s %d keys (dry run: nothing changed)\n", o.Action, res.Matched)
	} else {
		fmt.Fprintf(c.out, "%s %d keys\n", past, res.Acted)
		if res.Changed > 0 {
			fmt.Fprintf(c.out, "%d keys changed since they were read and were left alone\n", res.Changed)
		}
	}
	if res.Newer > 0 {
		fmt.Fprintf(c.out, "%d keys written by a newer build were left alone\n", res.Newer)
	}
	if res.More {
		fmt.Fprintf(c.out, "the limit (%d) was reached: more keys may match; run again\n", o.Limit)
	}
}

// cancel finishes an unfinished key with the answer given: `keys cancel`.
func (c *cli) cancel(ctx context.Context, args []string) error {
	fs, asJSON := flags("keys cancel")
	status := fs.Int("status", 0, "the answer's status: 2xx or 4xx (required)")
	body := fs.String("body", "", "the answer's body")
	bodyFile := fs.String("body-file", "", "file holding the answer's body (instead of -body)")
	force := fs.Bool("force", false, "cancel even when a call phase may have reached the remote side")
	skip := fs.Bool("skip-compensation", false, "cancel without the flow's compensation: the committed phases' writes stay")
	dryRun := fs.Bool("dry-run", false, "only print what the cancel would run, changing nothing")
	header := map[string][]string{}
	fs.Func("header", "a header of the answer, 'Name: value' (repeat)", func(v string) error {
		name, val, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return fmt.Errorf("want 'Name: value', got %q", v)
		}
		name = strings.TrimSpace(name)
		header[name] = append(header[name], strings.TrimSpace(val))
		return nil
	})
	if err := parse(fs, args, 2, "SCOPE KEY"); err != nil {
		return err
	}
	if *status == 0 {
		return badUsage("keys cancel: -status is required: the final answer's status, 2xx or 4xx")
	}
	b := []byte(*body)
	if *bodyFile != "" {
		if *body != "" {
			return badUsage("keys cancel: -body and -body-file together: choose one")
		}
		var err error
		if b, err = os.ReadFile(*bodyFile); err != nil {
			return badUsage("keys cancel: -body-file: %v", err)
		}
	}
	scope, key := fs.Arg(0), fs.Arg(1)
	p, err := c.engine.PreviewCancel(ctx, scope, key)
	if err == nil {
		// What will run, before anything does; on stderr with -json, whose stdout is
		// the key.
		w := c.out
		if *asJSON {
			w = c.errOut
		}
		fmt.Fprintf(w, "cancel key %q in scope %q, flow %q at recovery point %q: %s\n", key, scope, p.Flow, p.RecoveryPoint, p.Effect(*skip))
		if *dryRun {
			return nil
		}
		err = c.engine.CancelKey(ctx, scope, key, workflow.CancelOptions{Status: *status, Header: header, Body: b, Force: *force,
			SkipCompensation: *skip})
	}
	switch {
	case errors.Is(err, workflow.ErrNotFound):
		return fmt.Errorf("no key %q in scope %q", key, scope)
	case errors.Is(err, workflow.ErrInvalidRequest):
		return badUsage("keys cancel: %v", err)
	case errors.Is(err, workflow.ErrCallMayHaveRun), errors.Is(err, workflow.ErrWrongStatus),
		errors.Is(err, workflow.ErrCompensationUnknown), errors.Is(err, workflow.ErrCompensationFailed):
		return fmt.Errorf("keys cancel: nothing changed: %w", err)
	case err != nil:
		return err
	}
	after, err := c.inspect(ctx, scope, key)
	if err != nil {
		return err
	}
	if *asJSON {
		return c.json(after.KeySummary)
	}
	_, err = fmt.Fprintf(c.out, "cancelled key %q in scope %q: answers %d from now on (lock version %d)\n",
		key, scope, after.ResponseStatus, after.LockVersion)
	return err
}
