package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
)

// problemContentType is the media type of an RFC 9457 problem document.
const problemContentType = "application/problem+json"

// problem is an RFC 9457 problem document. The type is always about:blank: the status
// says what happened and the detail says it to a person.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// answer writes the engine's answer to an attempt: the response, or what err means
// over HTTP.
func (f *front) answer(w http.ResponseWriter, r *http.Request, req Request, res *Result, err error) {
	if err == nil && res != nil && res.Response != nil && res.Response.Status >= 100 && res.Response.Status <= 999 {
		writeResponse(w, r, res.Response, res.Replayed, 0)
		return
	}
	if err == nil {
		err = errors.New("the engine answered without a valid response")
	}
	a := classify(err)
	if a.pass != nil {
		writeResponse(w, r, a.pass, false, a.retryAfter)
		return
	}
	if a.level != 0 || a.status >= 500 {
		level := a.level
		if level == 0 {
			level = slog.LevelError
		}
		if r.Context().Err() != nil { // the client went away: nothing to alarm anyone about
			level = slog.LevelDebug
		}
		f.log.Log(r.Context(), level, "workflow: http: request failed",
			slog.Int("status", a.status), slog.String("flow", req.Flow), slog.String("method", req.Method),
			slog.String("route", req.Route), slog.String("scope", req.Scope), slog.String("key", req.Key),
			slog.Any("err", err))
	}
	if a.retryAfter > 0 {
		w.Header().Set("Retry-After", retryAfter(a.retryAfter))
	}
	writeProblem(w, a.status, a.detail)
}

// httpAnswer is what an engine error means over HTTP.
type httpAnswer struct {
	status     int
	detail     string
	retryAfter time.Duration    // sent as Retry-After when positive
	pass       *phases.Response // a 5xx response to pass on as it is
	level      slog.Level       // log at this level when non-zero; 5xx log as errors by default
}

// classify maps an error of Engine.Do to its HTTP answer. The detail never carries the
// error's text.
func classify(err error) httpAnswer {
	var (
		inProgress *InProgressError
		transient  *TransientError
		panicked   *phases.PanicError
	)
	switch {
	case errors.Is(err, ErrInvalidKey):
		return httpAnswer{status: http.StatusBadRequest, detail: "The " + KeyHeader + " header is invalid."}
	case errors.Is(err, ErrInvalidRequest):
		return httpAnswer{status: http.StatusBadRequest, detail: "The request's method or path is too long."}
	case errors.Is(err, ErrBodyTooLarge):
		return httpAnswer{status: http.StatusRequestEntityTooLarge, detail: "The request body is over the limit."}
	case errors.Is(err, ErrMismatch):
		return httpAnswer{status: http.StatusUnprocessableEntity,
			detail: "The idempotency key was already used for a different request (method, route or body)."}
	case errors.As(err, &inProgress):
		return httpAnswer{status: http.StatusConflict, retryAfter: inProgress.RetryAfter,
			detail: "Another request with this idempotency key is in progress; retry after it ends."}
	case errors.Is(err, ErrLeaseLost):
		return httpAnswer{status: http.StatusConflict, retryAfter: time.Second, level: slog.LevelWarn,
			detail: "Another attempt took this request over; retry to get its answer."}
	case errors.Is(err, ErrResponseTooLarge):
		return httpAnswer{status: http.StatusInternalServerError, detail: "The response is too large to store, so it was not sent."}
	case errors.Is(err, ErrDeadLettered):
		return httpAnswer{status: http.StatusInternalServerError, detail: "This request failed too often and was given up on."}
	case errors.Is(err, ErrNoResponse), errors.Is(err, ErrPhaseDataTooLarge), errors.As(err, &panicked):
		return httpAnswer{status: http.StatusInternalServerError, detail: "The request failed."}
	case errors.As(err, &transient) && transient.Response != nil && transient.Response.Status >= 500 && transient.Response.Status <= 999:
		return httpAnswer{status: transient.Response.Status, pass: transient.Response, retryAfter: transient.RetryAfter, level: slog.LevelWarn}
	case transient != nil:
		return httpAnswer{status: http.StatusServiceUnavailable, retryAfter: transient.RetryAfter, level: slog.LevelWarn,
			detail: "The request could not be completed now; nothing was lost, retry later."}
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, store.ErrConflict),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return httpAnswer{status: http.StatusServiceUnavailable, retryAfter: time.Second, level: slog.LevelWarn,
			detail: "The service is briefly unavailable; retry later."}
	default:
		return httpAnswer{status: http.StatusInternalServerError, detail: "The request failed."}
	}
}

// writeResponse writes resp. retry, when positive, is sent as Retry-After unless resp
// has one.
func writeResponse(w http.ResponseWriter, r *http.Request, resp *phases.Response, replayed bool, retry time.Duration) {
	merged := http.Header{}
	for k, v := range resp.Header {
		ck := http.CanonicalHeaderKey(k)
		merged[ck] = append(merged[ck], v...)
	}
	h := w.Header()
	for k, v := range merged {
		h[k] = v // the response's own header wins over one set before it
	}
	if replayed {
		h.Set(ReplayedHeader, "true")
	}
	if retry > 0 && h.Get("Retry-After") == "" {
		h.Set("Retry-After", retryAfter(retry))
	}
	if bodyAllowed(resp.Status) && r.Method != http.MethodHead {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body) // the client went away; nothing to do
	}
}

func writeProblem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retryAfter formats d as Retry-After delay-seconds: whole seconds, rounded up, at
// least 1.
func retryAfter(d time.Duration) string {
	s := max((d+time.Second-1)/time.Second, 1)
	return strconv.FormatInt(int64(s), 10)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
