package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemflow/idemflow/store"
)

// partitionRow is one partition as `partitions` prints it.
type partitionRow struct {
	Name string     `json:"name"`
	From *time.Time `json:"from"` // nil: MINVALUE (a table moved to the layout)
	To   *time.Time `json:"to"`   // nil: MAXVALUE
	// State is past (ends before the database's now), current, ahead (begins after
	// it) or detach pending (a concurrent detach began and did not finish).
	State string `json:"state"`
}

// partitions lists the key table's partitions, oldest first, and how many exist ahead
// of the database's now against how many the default keeps (docs/PARTITIONS.md). A
// key table that is not partitioned is said so, with exit status 0.
func (c *cli) partitions(ctx context.Context, args []string) error {
	fs, asJSON := flags("partitions")
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	st, err := store.NewInSchema(c.schema)
	if err != nil {
		return err
	}
	parts, err := st.Partitions(ctx, c.pool)
	if errors.Is(err, store.ErrNotPartitioned) {
		if *asJSON {
			return c.json(map[string]any{"partitioned": false})
		}
		_, err := fmt.Fprintln(c.out, "the key table is not partitioned (docs/PARTITIONS.md)")
		return err
	}
	if err != nil {
		return err
	}
	rep, err := c.engine.CheckPartitions(ctx)
	if err != nil {
		return err
	}
	var now time.Time
	if err := c.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now); err != nil {
		return err
	}
	rows := make([]partitionRow, 0, len(parts))
	for _, p := range parts {
		r := partitionRow{Name: p.Name, From: p.From, To: p.To, State: "current"}
		switch {
		case p.DetachPending:
			r.State = "detach pending"
		case p.To != nil && !p.To.After(now):
			r.State = "past"
		case p.From != nil && p.From.After(now):
			r.State = "ahead"
		}
		rows = append(rows, r)
	}
	if *asJSON {
		return c.json(struct {
			Partitioned bool           `json:"partitioned"`
			Ahead       int            `json:"ahead"`
			Want        int            `json:"want"`
			Low         bool           `json:"low"`
			Partitions  []partitionRow `json:"partitions"`
		}{true, rep.Ahead, rep.Want, rep.Low(), rows})
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tSTATE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", escape(r.Name), bound(r.From, "MINVALUE"), bound(r.To, "MAXVALUE"), r.State)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "enough"
	if rep.Low() {
		verdict = "too few: a key whose creation time has no partition cannot be claimed; run a sweeper or store's EnsurePartitions"
	}
	_, err = fmt.Fprintf(c.out, "%d partitions, %d ahead of now (the default creates %d ahead: %s)\n", len(rows), rep.Ahead, rep.Want, verdict)
	return err
}

// bound is a partition bound in UTC, or instead when there is none.
func bound(t *time.Time, instead string) string {
	if t == nil {
		return instead
	}
	return stamp(*t)
}
