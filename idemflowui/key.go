package idemflowui

import (
	"context"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/workflow"
)

// keyData is one key's page.
type keyData struct {
	base
	Info     *workflow.KeyInfo
	History  []workflow.Attempt // newest first
	ShowBody bool
	Body     string // the body as shown: cut to the limit, invalid UTF-8 replaced
	BodyCut  bool
	BodyText bool // the shown part is valid UTF-8
	BodyURL  string
	Limit    int
	Flash    string
	// Redrive and Release are the confirmation pages' paths, Cancel the cancel form's,
	// "" when the action does not apply to the key or the operator cannot write.
	Redrive, Release, Cancel string
	// The stored response (finished keys): its headers, one per value, sorted; its
	// body as shown when asked for (response=1), like the request's.
	Headers      [][2]string
	ShowResponse bool
	Response     string
	ResponseCut  bool
	ResponseText bool
	ResponseURL  string
	// DerivedKeys are the derived keys of the flow's call phases, FlowKnown false when
	// the flow is not registered in this process (see derivedKeys).
	DerivedKeys []derivedKey
	FlowKnown   bool
}

// flashes are the messages a key page shows after an action (its done parameter).
var flashes = map[string]string{
	"redriven":  "Re-driven: the key is back in progress, due now, and the next sweep runs it from its recovery point.",
	"released":  "Released: the lease was taken away and the lock version bumped; the next sweep (or the client's retry) takes the key.",
	"cancelled": "Cancelled: the answer below is stored and replayed to every retry; no sweeper runs the key again.",
}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) {
	v, msg := form(r)
	if msg == "" {
		_, _, msg = scopeKey(v)
	}
	flash, known := flashes[v.Get("done")]
	switch {
	case msg != "":
	case v.Get("done") != "" && !known:
		msg = "done: unknown action"
	case v.Get("body") != "" && v.Get("body") != "1":
		msg = "body: want 1 or nothing"
	case v.Get("response") != "" && v.Get("response") != "1":
		msg = "response: want 1 or nothing"
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	scope, key := v.Get("scope"), v.Get("key")
	info, err := h.engine.InspectKey(r.Context(), scope, key)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := &keyData{base: h.base(r, "Key "+key), Info: info, History: slices.Clone(info.History),
		ShowBody: v.Get("body") == "1", BodyURL: h.keyLink(scope, key, "body", "1") + "#request",
		Limit: h.opts.BodyLimit, Flash: flash}
	slices.Reverse(d.History)
	d.Explain, d.Runbook = explain(h.opts.RunbookURL, info.Status)
	d.DerivedKeys, d.FlowKnown = derivedKeys(h.engine, info)
	if d.ShowBody {
		d.Body, d.BodyCut, d.BodyText = h.shown(info.Request)
	}
	d.ShowResponse, d.ResponseURL = v.Get("response") == "1", h.keyLink(scope, key, "response", "1")+"#response"
	if d.ShowResponse {
		d.Response, d.ResponseCut, d.ResponseText = h.shown(info.ResponseBody)
	}
	for _, name := range slices.Sorted(maps.Keys(info.ResponseHeader)) {
		for _, val := range info.ResponseHeader[name] {
			d.Headers = append(d.Headers, [2]string{name, val})
		}
	}
	if d.CanWrite() {
		switch info.Status {
		case workflow.KeysDead:
			d.Redrive = h.confirmLink("redrive", scope, key)
		case workflow.KeysInProgress, workflow.KeysStuck:
			d.Release = h.confirmLink("release", scope, key)
		}
		if info.Status != workflow.KeysFinished {
			d.Cancel = h.link("/key/cancel?" + url.Values{"scope": {scope}, "key": {key}}.Encode())
		}
	}
	h.render(w, r, http.StatusOK, "key", d)
}

// shown is a stored body as a page shows it: cut to the limit, invalid UTF-8 replaced;
// cut says it was cut, text that the shown part is valid UTF-8.
func (h *Handler) shown(b []byte) (s string, cut, text bool) {
	if len(b) > h.opts.BodyLimit {
		b, cut = b[:h.opts.BodyLimit], true
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), cut, utf8.Valid(b)
}

// confirmLink is the path of the page that confirms an action on a key.
func (h *Handler) confirmLink(action, scope, key string) string {
	return h.link("/key/confirm?" + url.Values{"action": {action}, "scope": {scope}, "key": {key}}.Encode())
}

// confirmData is the page that asks before an action.
type confirmData struct {
	base
	Info   *workflow.KeyInfo
	Action string // "redrive" or "release"
	Post   string
	Back   string
}

// confirm asks for confirmation of an action on a key, saying what it will do.
func (h *Handler) confirm(w http.ResponseWriter, r *http.Request) {
	if h.opts.WriteToken == "" {
		h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
		return
	}
	b := h.base(r, "Confirm")
	if !b.CanWrite() {
		h.fail(w, r, http.StatusForbidden, "log in with the write token first")
		return
	}
	v, msg := form(r)
	if msg == "" {
		_, _, msg = scopeKey(v)
	}
	action := v.Get("action")
	if msg == "" && action != "redrive" && action != "release" {
		msg = "action: want redrive or release"
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	info, err := h.engine.InspectKey(r.Context(), v.Get("scope"), v.Get("key"))
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	dead := info.Status == workflow.KeysDead
	if (action == "redrive") != dead || info.Status == workflow.KeysFinished {
		h.fail(w, r, http.StatusConflict, "the key is "+string(info.Status)+": "+action+" does not apply to it")
		return
	}
	b.Title = "Confirm " + action
	d := &confirmData{base: b, Info: info, Action: action, Post: h.link("/key/" + action), Back: h.keyLink(info.Scope, info.Key)}
	h.render(w, r, http.StatusOK, "confirm", d)
}

// redrive and release run the action the confirmation page posted, then show the key.
func (h *Handler) redrive(w http.ResponseWriter, r *http.Request) {
	h.act(w, r, "redriven", h.engine.Redrive)
}

func (h *Handler) release(w http.ResponseWriter, r *http.Request) {
	h.act(w, r, "released", h.engine.ReleaseKey)
}

func (h *Handler) act(w http.ResponseWriter, r *http.Request, done string, do func(ctx context.Context, scope, key string) error) {
	v, msg := form(r)
	if msg == "" {
		_, _, msg = scopeKey(v)
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	scope, key := v.Get("scope"), v.Get("key")
	if err := do(r.Context(), scope, key); err != nil {
		h.failErr(w, r, err)
		return
	}
	http.Redirect(w, r, h.keyLink(scope, key, "done", done), http.StatusSeeOther)
}
