package sweeper

// SetStoppingHook makes Stop call f right after it told the loop to stop, so tests can
// order their steps after that moment without sleeping.
func SetStoppingHook(s *Sweeper, f func()) { s.stopping = f }
