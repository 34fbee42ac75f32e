package idemflowui

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Writes: a login with the write token gives a session cookie; every POST that
// changes something needs that cookie, a CSRF token made from it, and no sign of
// coming from another origin. Both the cookie and the token are HMACs under the
// handler's secret, so nothing is stored on the server and a restart ends every
// session.

const (
	sessionCookie = "idemflow_session"
	csrfField     = "csrf"
)

// sign is the HMAC of the parts under the handler's secret, base64url.
func (h *Handler) sign(parts ...string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession is a session cookie's value: its expiry and the signature of it.
func (h *Handler) newSession(now time.Time) string {
	exp := strconv.FormatInt(now.Add(h.opts.Session).Unix(), 10)
	return exp + "." + h.sign("session", exp)
}

// session returns the request's valid session cookie's value, or "" when there is
// none (writes disabled, no cookie, a forged or expired one).
func (h *Handler) session(r *http.Request) string {
	if h.opts.WriteToken == "" {
		return ""
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	exp, sig, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(h.sign("session", exp))) {
		return ""
	}
	t, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || time.Now().Unix() >= t {
		return ""
	}
	return c.Value
}

// csrf is the CSRF token of a form: bound to the session (or, for the login form, to
// the login itself).
func (h *Handler) csrf(session string) string {
	if session == "" {
		return h.sign("csrf-login")
	}
	return h.sign("csrf", session)
}

// checkCSRF refuses a request from another origin or whose form lacks the token for
// session.
func (h *Handler) checkCSRF(r *http.Request, session string) (string, bool) {
	if err := h.cop.Check(r); err != nil {
		return "cross-origin request refused", false
	}
	got := r.PostFormValue(csrfField)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(h.csrf(session))) != 1 {
		return "missing or invalid CSRF token: reload the page and try again", false
	}
	return "", true
}

// write wraps a state-changing POST: refused 403 when writes are disabled, without a
// session, from another origin or without the form's CSRF token.
func (h *Handler) write(next func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.opts.WriteToken == "" {
			h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
			return
		}
		s := h.session(r)
		if s == "" {
			h.fail(w, r, http.StatusForbidden, "log in with the write token first")
			return
		}
		if msg, ok := h.checkCSRF(r, s); !ok {
			h.fail(w, r, http.StatusForbidden, msg)
			return
		}
		next(w, r)
	}
}

type loginData struct {
	base
	Failed bool
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if h.opts.WriteToken == "" {
		h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
		return
	}
	h.render(w, r, http.StatusOK, "login", &loginData{base: h.base(r, "Log in")})
}

// login checks the write token (in constant time) and sets the session cookie.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if h.opts.WriteToken == "" {
		h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
		return
	}
	if msg, ok := h.checkCSRF(r, ""); !ok {
		h.fail(w, r, http.StatusForbidden, msg)
		return
	}
	tok := r.PostFormValue("token")
	if subtle.ConstantTimeCompare([]byte(tok), []byte(h.opts.WriteToken)) != 1 {
		d := &loginData{base: h.base(r, "Log in"), Failed: true}
		h.render(w, r, http.StatusForbidden, "login", d)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: h.newSession(time.Now()), Path: h.link("/"),
		MaxAge: int(h.opts.Session.Seconds()), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.link("/"), http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: h.link("/"), MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.link("/"), http.StatusSeeOther)
}
