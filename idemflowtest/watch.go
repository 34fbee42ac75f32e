package idemflowtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/idemflow/idemflow/phases"
)

// Watcher checks the key table's invariants over time, for users' own load and chaos
// tests: each Snapshot reads every key row and compares it with the previous snapshot
// of the same row (same scope, key and identity). A violation is
//
//   - a lock version that moved back;
//   - a finished row that changed in any way (status, response, lock version);
//   - a recovery point that moved back along its flow's phases (started, then the
//     phases in order, then finished), for the flows the Watcher was given;
//   - a row of a flow the Watcher knows at a recovery point that is none of its phases.
//
// Rows that disappear (retention) or reappear with a new identity (a key reused after
// it expired) start over. A Watcher is safe for concurrent use.
type Watcher struct {
	flows map[string][]string // flow name -> recovery points in order

	mu         sync.Mutex
	last       map[watchID]watchRow
	snapshots  int
	violations []string

	stop    chan struct{}
	done    chan struct{}
	loopErr error
}

type watchID struct{ scope, key, id string }

type watchRow struct {
	flow, status, point string
	lockVersion         int64
	response            []byte // status, headers and body of a finished row
}

// NewWatcher returns a Watcher that knows the order of the given flows' phases.
func NewWatcher(flows ...phases.Flow) *Watcher {
	w := &Watcher{flows: map[string][]string{}, last: map[watchID]watchRow{}}
	for _, f := range flows {
		order := []string{phases.Started}
		for _, p := range f.Phases {
			order = append(order, p.Name)
		}
		w.flows[f.Name] = append(order, phases.Finished)
	}
	return w
}

// Snapshot reads the key table once and records any violation against the previous
// snapshot. It returns an error only if the table could not be read.
func (w *Watcher) Snapshot(ctx context.Context, db Querier) error {
	rows, err := db.Query(ctx, `SELECT scope, idempotency_key, id::text, flow, status, recovery_point, lock_version,
			CASE WHEN status = 'finished' THEN response_status::text::bytea || '|' || response_headers::text::bytea || '|' || response_body END
		FROM idemflow_keys`)
	if err != nil {
		return fmt.Errorf("idemflowtest: snapshot the key table: %w", err)
	}
	defer rows.Close()
	now := map[watchID]watchRow{}
	for rows.Next() {
		var id watchID
		var r watchRow
		if err := rows.Scan(&id.scope, &id.key, &id.id, &r.flow, &r.status, &r.point, &r.lockVersion, &r.response); err != nil {
			return fmt.Errorf("idemflowtest: snapshot the key table: %w", err)
		}
		now[id] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idemflowtest: snapshot the key table: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, r := range now {
		w.compare(id, w.last[id], r)
	}
	w.last = now
	w.snapshots++
	return nil
}

// compare records what is wrong with a row that was prev (zero if unseen) and is now r.
func (w *Watcher) compare(id watchID, prev, r watchRow) {
	name := fmt.Sprintf("key %q/%q (id %s)", id.scope, id.key, id.id)
	order, known := w.flows[r.flow]
	at := slices.Index(order, r.point)
	if known && at < 0 {
		w.violations = append(w.violations, fmt.Sprintf("%s: recovery point %q is not a phase of flow %q", name, r.point, r.flow))
	}
	if prev.flow == "" {
		return
	}
	switch {
	case r.lockVersion < prev.lockVersion:
		w.violations = append(w.violations, fmt.Sprintf("%s: lock version moved back from %d to %d", name, prev.lockVersion, r.lockVersion))
	case prev.status == "finished" && (r.status != prev.status || r.lockVersion != prev.lockVersion || !bytes.Equal(r.response, prev.response)):
		w.violations = append(w.violations, fmt.Sprintf("%s: a finished row changed (%s, lock version %d, response %q; was lock version %d, response %q)",
			name, r.status, r.lockVersion, r.response, prev.lockVersion, prev.response))
	case known && at >= 0 && at < slices.Index(order, prev.point):
		w.violations = append(w.violations, fmt.Sprintf("%s: recovery point moved back from %s to %s", name, prev.point, r.point))
	}
}

// Start snapshots the table back to back in a goroutine until Stop. A failed read ends
// the loop; Stop returns it.
func (w *Watcher) Start(ctx context.Context, db Querier) {
	w.stop, w.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			if err := w.Snapshot(ctx, db); err != nil {
				w.loopErr = err // read by Stop after done is closed
				return
			}
		}
	}()
}

// Stop ends the loop Start began and returns the violations seen (Err) and the error
// that ended the loop early, if any.
func (w *Watcher) Stop() error {
	close(w.stop)
	<-w.done
	return errors.Join(w.loopErr, w.Err())
}

// Snapshots is the number of snapshots taken.
func (w *Watcher) Snapshots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snapshots
}

// Err returns the violations seen so far, joined, or nil.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for _, v := range w.violations {
		errs = append(errs, errors.New(v))
	}
	return errors.Join(errs...)
}
