package workflow

// Waiting is how many attempts wait for a place in flight on e.
func Waiting(e *Engine) int {
	e.adm.mu.Lock()
	defer e.adm.mu.Unlock()
	return len(e.adm.waiting)
}
