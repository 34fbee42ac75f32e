package idemflowui

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/idemflow/idemflow/workflow"
)

// The pages that act on many keys (/bulk) and cancel one key (/key/cancel).

// bulkData is the page that counts the keys a bulk action selects, and then asks to
// confirm it, or says what it did.
type bulkData struct {
	base
	Action                          string // "redrive" or "release"
	Flow, Scope, Point, ErrContains string
	Count                           workflow.BulkResult // the dry run's
	Done                            *workflow.BulkResult
	Post, Back                      string
	Limit                           int
}

// bulkOptions reads a bulk action's form: action, flow, scope, point, error.
func bulkOptions(v url.Values) (workflow.BulkOptions, string) {
	o := workflow.BulkOptions{Action: workflow.BulkAction(v.Get("action")), Flow: v.Get("flow"), Scope: v.Get("scope"),
		RecoveryPoint: v.Get("point"), ErrorContains: v.Get("error")}
	switch {
	case o.Action != workflow.BulkRedrive && o.Action != workflow.BulkRelease:
		return o, "action: want redrive or release"
	case o.Flow == "" && o.Scope == "" && o.RecoveryPoint == "" && o.ErrorContains == "":
		return o, "give a filter (flow, scope, recovery point or error text): the page never acts on every key at once"
	}
	return o, ""
}

// writer checks that the visitor may change keys, answering 403 when not.
func (h *Handler) writer(w http.ResponseWriter, r *http.Request) (base, bool) {
	b := h.base(r, "")
	switch {
	case h.opts.WriteToken == "":
		h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
	case !b.CanWrite():
		h.fail(w, r, http.StatusForbidden, "log in with the write token first")
	default:
		return b, true
	}
	return b, false
}

// bulkCount counts, changing nothing, the keys a bulk action would act on, and asks
// to confirm it with that count.
func (h *Handler) bulkCount(w http.ResponseWriter, r *http.Request) {
	b, ok := h.writer(w, r)
	if !ok {
		return
	}
	v, msg := form(r)
	var o workflow.BulkOptions
	if msg == "" {
		o, msg = bulkOptions(v)
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	o.DryRun = true
	res, err := h.engine.BulkKeys(r.Context(), o)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	b.Title = "Confirm " + string(o.Action)
	d := h.bulkPage(b, o)
	d.Count = res
	h.render(w, r, http.StatusOK, "bulk", d)
}

func (h *Handler) bulkPage(b base, o workflow.BulkOptions) *bulkData {
	status := workflow.KeysDead
	if o.Action == workflow.BulkRelease {
		status = workflow.KeysInProgress
	}
	back := url.Values{"status": {string(status)}}
	for name, val := range map[string]string{"flow": o.Flow, "scope": o.Scope} {
		if val != "" {
			back.Set(name, val)
		}
	}
	return &bulkData{base: b, Action: string(o.Action), Flow: o.Flow, Scope: o.Scope, Point: o.RecoveryPoint,
		ErrContains: o.ErrorContains, Post: h.link("/bulk"), Back: h.link("/keys?" + back.Encode()), Limit: workflow.BulkLimitDefault}
}

// bulkAct runs a confirmed bulk action on at most the number of keys the operator
// saw counted (expect), and says what it did.
func (h *Handler) bulkAct(w http.ResponseWriter, r *http.Request) {
	v, msg := form(r)
	var o workflow.BulkOptions
	if msg == "" {
		o, msg = bulkOptions(v)
	}
	n, err := strconv.Atoi(v.Get("expect"))
	if msg == "" && (err != nil || n < 1 || n > workflow.BulkLimitMax) {
		msg = "expect: want the number of keys confirmed, 1 to " + strconv.Itoa(workflow.BulkLimitMax)
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	o.Limit = n // never more keys than the operator confirmed
	res, err := h.engine.BulkKeys(r.Context(), o)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	b := h.base(r, "Done: "+string(o.Action))
	d := h.bulkPage(b, o)
	d.Done = &res
	h.render(w, r, http.StatusOK, "bulk", d)
}

// cancelData is the form that cancels a key with a final answer.
type cancelData struct {
	base
	Info                *workflow.KeyInfo
	Status, ContentType string
	Body                string
	Refused             *workflow.CallMayHaveRunError
	Message             string
	Post, Back          string
	// Preview is what the cancel will run (nil when it could not be read); Effect says
	// it in a sentence, Skip whether the compensation is skipped (the form's choice).
	Preview *workflow.CancelPreview
	Effect  string
	Skip    bool
}

// preview fills in what the cancel of d's key will run, as the engine reads it now.
func (h *Handler) preview(r *http.Request, d *cancelData) error {
	p, err := h.engine.PreviewCancel(r.Context(), d.Info.Scope, d.Info.Key)
	if err != nil {
		return err
	}
	d.Preview, d.Effect = p, p.Effect(d.Skip)
	return nil
}

// cancelForm shows the form that cancels a key.
func (h *Handler) cancelForm(w http.ResponseWriter, r *http.Request) {
	b, ok := h.writer(w, r)
	if !ok {
		return
	}
	v, msg := form(r)
	if msg == "" {
		_, _, msg = scopeKey(v)
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
	if info.Status == workflow.KeysFinished {
		h.fail(w, r, http.StatusConflict, "the key is finished: it already has its answer")
		return
	}
	b.Title = "Cancel " + info.Key
	d := &cancelData{base: b, Info: info, Status: "409", ContentType: "application/problem+json",
		Body: `{"type":"about:blank","title":"Cancelled by the operator","status":409}`,
		Post: h.link("/key/cancel"), Back: h.keyLink(info.Scope, info.Key)}
	if err := h.preview(r, d); err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "cancel", d)
}

// cancel stores the operator's answer; a refusal (a call phase may have run, or an
// answer that cannot be stored) shows the form again with the reason.
func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	v, msg := form(r)
	if msg == "" {
		_, _, msg = scopeKey(v)
	}
	status, err := strconv.Atoi(v.Get("status"))
	if msg == "" && err != nil {
		msg = "status: want a number, 2xx or 4xx"
	}
	if msg != "" {
		h.fail(w, r, http.StatusBadRequest, msg)
		return
	}
	scope, key := v.Get("scope"), v.Get("key")
	opts := workflow.CancelOptions{Status: status, Body: []byte(v.Get("body")), Force: v.Get("force") == "1",
		SkipCompensation: v.Get("skip_compensation") == "1"}
	if ct := v.Get("content_type"); ct != "" {
		opts.Header = map[string][]string{"Content-Type": {ct}}
	}
	err = h.engine.CancelKey(r.Context(), scope, key, opts)
	var refused *workflow.CallMayHaveRunError
	code := http.StatusConflict
	switch {
	case err == nil:
		http.Redirect(w, r, h.keyLink(scope, key, "done", "cancelled"), http.StatusSeeOther)
		return
	case errors.As(err, &refused):
	case errors.Is(err, workflow.ErrCompensationUnknown), errors.Is(err, workflow.ErrCompensationFailed):
	case errors.Is(err, workflow.ErrInvalidRequest):
		code = http.StatusBadRequest
	default:
		h.failErr(w, r, err)
		return
	}
	info, ierr := h.engine.InspectKey(r.Context(), scope, key)
	if ierr != nil {
		h.failErr(w, r, ierr)
		return
	}
	d := &cancelData{base: h.base(r, "Cancel "+key), Info: info, Status: v.Get("status"), ContentType: v.Get("content_type"),
		Body: v.Get("body"), Refused: refused, Post: h.link("/key/cancel"), Back: h.keyLink(scope, key),
		Skip: opts.SkipCompensation}
	if refused == nil {
		d.Message = err.Error()
	}
	if err := h.preview(r, d); err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, code, "cancel", d)
}
