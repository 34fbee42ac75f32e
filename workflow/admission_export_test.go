package workflow

// Waiting is how many attempts wait for a place in flight on e.
func Waiting(e *Engine) int {
	e.adm.mu.Lock()
	defer e.adm.mu.Unlock()
	return len(e.adm.waiting)
}

// Draining reports whether a drain began on e.
func Draining(e *Engine) bool { return e.adm.isDraining() }
