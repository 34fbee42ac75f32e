package workflow

import "time"

// SetLayoutRetry sets the wait before e's first retry of its start-up check after a
// failure (it doubles from there): a test that keeps the layout unknown sets it long,
// one that watches the retry sets it to a nanosecond (zero is the default). Call it
// before e is used.
func SetLayoutRetry(e *Engine, first time.Duration) { e.layout.first = first }

// LayoutLearnt reports whether e's start-up check has succeeded.
func LayoutLearnt(e *Engine) bool { return e.layout.learnt.Load() }
