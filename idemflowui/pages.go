package idemflowui

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/idemflow/idemflow/workflow"
)

// base is what every page's layout needs.
type base struct {
	Title    string
	Prefix   string
	Writable bool   // started with a write token
	Session  string // the operator's session, "" when not logged in
	Write    bool   // the session may change keys (a login with the write token)
	CSRF     string
	Nav      string // the status of the list page shown, for the navigation
	// Explain says what the page's status means, and Runbook links its runbook
	// section (Options.RunbookURL); both "" on pages of no one status.
	Explain, Runbook string
}

func (h *Handler) base(r *http.Request, title string) base {
	s, write := h.session(r)
	return base{Title: title, Prefix: h.opts.Prefix, Writable: h.opts.WriteToken != "", Session: s, Write: write, CSRF: h.csrf(s)}
}

// CanWrite says whether the page shows buttons that change keys.
func (b base) CanWrite() bool { return b.Session != "" && b.Write }

type errorData struct {
	base
	Status  int
	Message string
}

// fail answers with an error page. The message is text, escaped like every value.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	d := &errorData{base: h.base(r, http.StatusText(status)), Status: status, Message: msg}
	h.render(w, r, status, "error", d)
}

// failErr answers for an error of the admin API: 400 for bad input, 404 for a missing
// key, 409 for a key in the wrong state; else 500, logged, with no detail shown.
func (h *Handler) failErr(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, workflow.ErrInvalidScope), errors.Is(err, workflow.ErrInvalidKey), errors.Is(err, workflow.ErrEmptyFilter),
		errors.Is(err, workflow.ErrInvalidRequest), errors.Is(err, workflow.ErrUnknownStatus),
		errors.Is(err, workflow.ErrInvalidCursor):
		h.fail(w, r, http.StatusBadRequest, err.Error())
	case errors.Is(err, workflow.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "no such key")
	case errors.Is(err, workflow.ErrWrongStatus):
		h.fail(w, r, http.StatusConflict, err.Error()+": the key changed since the page was shown; nothing was done")
	default:
		h.opts.Logger.ErrorContext(r.Context(), "idemflowui: page failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		h.fail(w, r, http.StatusInternalServerError, "the key table could not be read; see the server's log")
	}
}

// render executes a page into a buffer first, so that a failing template never sends
// half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, page string, data any) {
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.opts.Logger.ErrorContext(r.Context(), "idemflowui: render failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// form is a request's query (GET) or form (POST) values, checked: well formed, UTF-8,
// and no name given twice.
func form(r *http.Request) (url.Values, string) {
	raw := r.URL.RawQuery
	if r.Method == http.MethodPost {
		if err := r.ParseForm(); err != nil {
			return nil, "malformed form: " + err.Error()
		}
		return checkValues(r.PostForm)
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, "malformed query: " + err.Error()
	}
	return checkValues(v)
}

func checkValues(v url.Values) (url.Values, string) {
	for name, vals := range v {
		if !utf8.ValidString(name) {
			return nil, "a parameter's name is not UTF-8"
		}
		if len(vals) > 1 {
			return nil, "parameter " + name + " is given more than once"
		}
		if !utf8.ValidString(vals[0]) {
			return nil, "parameter " + name + " is not UTF-8"
		}
	}
	return v, ""
}

// scopeKey reads and checks the scope and key of a key page or action.
func scopeKey(v url.Values) (scope, key, msg string) {
	scope, key = v.Get("scope"), v.Get("key")
	switch {
	case scope == "" || len(scope) > 255:
		return "", "", "scope: want 1 to 255 bytes"
	case workflow.ValidateKey(key) != nil:
		return "", "", "key: want 1 to 255 printable ASCII characters"
	}
	return scope, key, ""
}

// keyLink is the key page's path with its query.
func (h *Handler) keyLink(scope, key string, extra ...string) string {
	v := url.Values{"scope": {scope}, "key": {key}}
	for i := 0; i+1 < len(extra); i += 2 {
		v.Set(extra[i], extra[i+1])
	}
	return h.link("/key?" + v.Encode())
}

// statuses are the lists, in the navigation's order.
var statuses = []workflow.KeyStatus{workflow.KeysInProgress, workflow.KeysStuck, workflow.KeysDead, workflow.KeysFinished}

type listData struct {
	base
	Status           workflow.KeyStatus
	Flow, Scope, Age string
	// Bulk is the action the list's keys can be given at once ("" for none): redrive
	// on the dead list, release on the lists of keys in progress.
	Bulk        string
	Keys        []workflow.KeySummary
	Next, First string
	Statuses    []workflow.KeyStatus
	// Failures are, on the dead-letter list, each key's failed phase and the class of
	// its last error, by key ID; nil on the other lists.
	Failures map[string]failure
}

// list is a page of keys of one status, filtered by flow, scope and age.
func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	v, msg := form(r)
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	status := workflow.KeyStatus(v.Get("status"))
	if status == "" {
		status = workflow.KeysInProgress
	}
	if !slices.Contains(statuses, status) {
		h.fail(w, r, http.StatusBadRequest, "status: want in_progress, stuck, dead or finished")
		return
	}
	o := workflow.ListOptions{Status: status, Flow: v.Get("flow"), Scope: v.Get("scope"), Limit: h.opts.PageSize, After: v.Get("after")}
	if age := v.Get("age"); age != "" {
		d, err := time.ParseDuration(age)
		if err != nil || d < 0 {
			h.fail(w, r, http.StatusBadRequest, "age: want a duration such as 10m or 2h, not negative")
			return
		}
		o.OlderThan = d
	}
	if len(o.Scope) > 255 {
		h.fail(w, r, http.StatusBadRequest, "scope: want at most 255 bytes")
		return
	}
	page, err := h.engine.ListKeys(r.Context(), o)
	if errors.Is(err, workflow.ErrInvalidCursor) {
		h.fail(w, r, http.StatusBadRequest, "after: not a cursor of a page of this list")
		return
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := &listData{base: h.base(r, "Keys: "+string(status)), Status: status, Flow: o.Flow, Scope: o.Scope,
		Age: v.Get("age"), Keys: page.Keys, Statuses: statuses}
	d.Nav = string(status)
	d.Explain, d.Runbook = explain(h.opts.RunbookURL, status)
	if status == workflow.KeysDead {
		if d.Failures, err = h.failures(r.Context(), page.Keys); err != nil {
			h.failErr(w, r, err)
			return
		}
	}
	if d.CanWrite() {
		d.Bulk = map[workflow.KeyStatus]string{workflow.KeysDead: "redrive", workflow.KeysInProgress: "release", workflow.KeysStuck: "release"}[status]
	}
	filter := url.Values{"status": {string(status)}}
	for _, f := range []string{"flow", "scope", "age"} {
		if v.Get(f) != "" {
			filter.Set(f, v.Get(f))
		}
	}
	if o.After != "" {
		d.First = h.link("/keys?" + filter.Encode())
	}
	if page.Next != "" {
		filter.Set("after", page.Next)
		d.Next = h.link("/keys?" + filter.Encode())
	}
	h.render(w, r, http.StatusOK, "list", d)
}

// template helpers shared by the pages.
var funcs = template.FuncMap{
	"stamp": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"ago": func(t time.Time) string { return ago(time.Since(t)) },
	"dur": ago,
	"keyURL": func(prefix, scope, key string) string {
		return prefix + "/key?" + url.Values{"scope": {scope}, "key": {key}}.Encode()
	},
	"listURL": func(prefix, status, flow string) string {
		v := url.Values{"status": {status}}
		if flow != "" {
			v.Set("flow", flow)
		}
		return prefix + "/keys?" + v.Encode()
	},
}

// ago is a duration as an operator reads it: "42s", "3m20s", "2h05m", "4d03h".
func ago(d time.Duration) string {
	d = max(d, 0).Truncate(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 48*time.Hour:
		if d%time.Hour == 0 {
			return fmt.Sprintf("%dh", d/time.Hour)
		}
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	return fmt.Sprintf("%dd%02dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}
