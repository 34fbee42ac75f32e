package idemflowui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Logins: a login with the write token (or the read token) gives a session cookie
// holding a random session id; the handler keeps its sessions in memory, so logging
// out ends a session on the server (its cookie and its CSRF token stop working at
// once) and a restart ends them all. Every POST that changes something needs a write
// session's cookie, a CSRF token made from it, and no sign of coming from another
// origin. With a read token every page needs a session too.

const (
	sessionCookie = "idemflow_session"
	csrfField     = "csrf"
)

// SessionsMax is the most live sessions a Handler keeps; a login beyond it ends the
// session closest to its expiry.
const SessionsMax = 1000

// sessions are the live logins, by id.
type sessions struct {
	mu   sync.Mutex
	byID map[string]session
}

// session is one login: until when it lasts and whether it may change keys.
type session struct {
	expires time.Time
	write   bool
}

// start makes a new session and returns its id.
func (s *sessions) start(now time.Time, d time.Duration, write bool) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := base64.RawURLEncoding.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.byID {
		if !now.Before(v.expires) {
			delete(s.byID, k)
		}
	}
	for len(s.byID) >= SessionsMax {
		var first string
		for k, v := range s.byID {
			if first == "" || v.expires.Before(s.byID[first].expires) {
				first = k
			}
		}
		delete(s.byID, first)
	}
	s.byID[id] = session{expires: now.Add(d), write: write}
	return id, nil
}

// get returns the live session of id.
func (s *sessions) get(id string, now time.Time) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.byID[id]
	if ok && !now.Before(v.expires) {
		delete(s.byID, id)
		ok = false
	}
	return v, ok
}

// end forgets the session of id.
func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// sign is the HMAC of the parts under the handler's secret, base64url.
func (h *Handler) sign(parts ...string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// loginEnabled says whether the handler has a token to log in with.
func (h *Handler) loginEnabled() bool { return h.opts.WriteToken != "" || h.opts.ReadToken != "" }

// session returns the id of the request's live session and whether it may write, or ""
// when there is none (no token configured, no cookie, an unknown, ended or expired one).
func (h *Handler) session(r *http.Request) (string, bool) {
	if !h.loginEnabled() {
		return "", false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return "", false
	}
	s, ok := h.sessions.get(c.Value, time.Now())
	if !ok {
		return "", false
	}
	return c.Value, s.write
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
// write session, from another origin or without the form's CSRF token.
func (h *Handler) write(next func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.opts.WriteToken == "" {
			h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
			return
		}
		s, write := h.session(r)
		if !write {
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
	Reads  bool // reading needs a login (a read token is set)
	Failed bool
}

// noLogin answers a login page or form of a handler without tokens.
func (h *Handler) noLogin(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, http.StatusForbidden, "this page is read-only: it was started without a write token")
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if !h.loginEnabled() {
		h.noLogin(w, r)
		return
	}
	h.render(w, r, http.StatusOK, "login", &loginData{base: h.base(r, "Log in"), Reads: h.opts.ReadToken != ""})
}

// needLogin answers a page that needs a session (a handler with a read token) with the
// login form, 401, and nothing of the key table.
func (h *Handler) needLogin(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusUnauthorized, "login", &loginData{base: h.base(r, "Log in"), Reads: h.opts.ReadToken != ""})
}

// login checks the token (in constant time, against both) and starts a session.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !h.loginEnabled() {
		h.noLogin(w, r)
		return
	}
	if msg, ok := h.checkCSRF(r, ""); !ok {
		h.fail(w, r, http.StatusForbidden, msg)
		return
	}
	tok := []byte(r.PostFormValue("token"))
	write := h.opts.WriteToken != "" && subtle.ConstantTimeCompare(tok, []byte(h.opts.WriteToken)) == 1
	read := h.opts.ReadToken != "" && subtle.ConstantTimeCompare(tok, []byte(h.opts.ReadToken)) == 1
	if !write && !read {
		d := &loginData{base: h.base(r, "Log in"), Reads: h.opts.ReadToken != "", Failed: true}
		h.render(w, r, http.StatusForbidden, "login", d)
		return
	}
	if old, _ := h.session(r); old != "" {
		h.sessions.end(old) // a new login replaces the old session
	}
	id, err := h.sessions.start(time.Now(), h.opts.Session, write)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: h.link("/"),
		MaxAge: int(h.opts.Session.Seconds()), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.link("/"), http.StatusSeeOther)
}

// logout ends the request's session on the server and clears its cookie. It needs the
// session and its CSRF token, like a write.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.loginEnabled() {
		h.noLogin(w, r)
		return
	}
	s, _ := h.session(r)
	if s == "" {
		h.fail(w, r, http.StatusForbidden, "not logged in")
		return
	}
	if msg, ok := h.checkCSRF(r, s); !ok {
		h.fail(w, r, http.StatusForbidden, msg)
		return
	}
	h.sessions.end(s)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: h.link("/"), MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.link("/"), http.StatusSeeOther)
}
