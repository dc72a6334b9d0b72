package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// CookieName is the cookie that carries the token after a visit to
// /?token=… (HttpOnly, SameSite=Strict, Path=/).
const CookieName = "talos_web_token"

// tokenCheck compares presented tokens with the configured one in
// constant time: both sides are hashed first, so neither the content nor
// the length of the token leaks through timing.
type tokenCheck struct{ sum [32]byte }

func newTokenCheck(token string) tokenCheck { return tokenCheck{sum: sha256.Sum256([]byte(token))} }

func (c tokenCheck) ok(presented string) bool {
	s := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(s[:], c.sum[:]) == 1
}

// authorize admits r or answers it. A token in the query string, when
// right, becomes the cookie and the browser is sent (303) to the same
// address without it, so the token does not stay in the address bar or
// history. Otherwise the bearer header or the cookie must hold the token.
// Nothing here logs the token or echoes it.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) bool {
	if q := r.URL.Query(); q.Has("token") {
		if !h.token.ok(q.Get("token")) {
			h.unauthorized(w, r)
			return false
		}
		http.SetCookie(w, &http.Cookie{
			Name: CookieName, Value: q.Get("token"), Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		})
		q.Del("token")
		// A relative target on this host only: "//evil.example" would
		// be another host (a backslash is escaped by EscapedPath).
		target := "/" + strings.TrimLeft(r.URL.EscapedPath(), "/")
		if enc := q.Encode(); enc != "" {
			target += "?" + enc
		}
		w.Header().Set("Location", target)
		w.WriteHeader(http.StatusSeeOther)
		return false
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, found := strings.Cut(auth, " ")
		if found && strings.EqualFold(scheme, "Bearer") && h.token.ok(strings.TrimSpace(tok)) {
			return true
		}
		h.unauthorized(w, r)
		return false
	}
	if c, err := r.Cookie(CookieName); err == nil && h.token.ok(c.Value) {
		return true
	}
	h.unauthorized(w, r)
	return false
}

// unauthorized answers 401 with a page saying how to get in.
func (h *handler) unauthorized(w http.ResponseWriter, r *http.Request) {
	h.o.Logger.Debug("dashboard request without a valid token", "path", r.URL.Path, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("WWW-Authenticate", `Bearer realm="talos"`)
	w.WriteHeader(http.StatusUnauthorized)
	if err := h.pages["unauthorized"].Execute(w, nil); err != nil {
		h.o.Logger.Error("render page", "page", "unauthorized", "err", err)
	}
}
