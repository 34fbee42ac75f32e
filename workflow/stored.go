package workflow

// representationHeaders describe a response body itself: what it is, how it is encoded
// and which request headers chose it. The bytes mean nothing without them, so they are
// stored and replayed with the body whatever Config.StoredHeaders lists (gzip bytes are
// never replayed labelled application/json).
var representationHeaders = map[string]bool{"Content-Type": true, "Content-Encoding": true, "Vary": true}

// keeps reports whether the engine stores and replays the header of canonical name: it
// is allow-listed (Config.StoredHeaders, less the names never stored) or describes the
// body (representationHeaders).
func (e *Engine) keeps(canonical string) bool {
	return e.stored[canonical] || representationHeaders[canonical]
}
