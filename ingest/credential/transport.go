package credential

import (
	"context"
	"net/http"

	"github.com/talos-audit/talos/schemas"
)

type tokenKey struct{}

// WithToken is ctx carrying the credential of one upstream call; a
// Transport sends it as the request's bearer token.
func WithToken(ctx context.Context, tok string) context.Context {
	return context.WithValue(ctx, tokenKey{}, tok)
}

// Transport is the http.RoundTripper of one HTTP upstream's session. It
// removes any Authorization header from every request (nothing of the
// client's reaches the upstream) and sets the call's credential (WithToken)
// or, for the session's own requests (initialize, tools/list, the prompts
// and resources listings, its stream), the server's secret in mode secret,
// and in mode token_exchange the gateway's own token for that server
// (Broker.SessionToken: there is no client token to exchange for them).
// A session token that cannot be had fails the request, which is not sent.
type Transport struct {
	Base    http.RoundTripper // default http.DefaultTransport
	Session string            // the credential of requests outside a call; "" for none
	// session, when set, is asked for that credential instead of Session
	// at each request (a secret rotated on disk).
	session *secretSource
	// own, when set, obtains that credential instead (mode token_exchange).
	own func(context.Context) (string, error)
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	tok, _ := r.Context().Value(tokenKey{}).(string)
	if tok == "" {
		tok = t.Session
		switch {
		case t.session != nil:
			tok = t.session.get()
		case t.own != nil:
			var err error
			if tok, err = t.own(r.Context()); err != nil {
				if r.Body != nil {
					r.Body.Close()
				}
				return nil, err
			}
		}
	}
	r = r.Clone(r.Context())
	r.Header.Del("Authorization")
	if tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// Transport is the RoundTripper of serverID's HTTP session.
func (b *Broker) Transport(serverID string, base http.RoundTripper) *Transport {
	t := &Transport{Base: base}
	switch s := b.cfg.servers[serverID]; {
	case s == nil:
	case s.mode == schemas.TokenModeSecret:
		t.session = s.secret
	case s.mode == schemas.TokenModeTokenExchange && s.ownSession:
		t.own = func(ctx context.Context) (string, error) { return b.SessionToken(ctx, serverID) }
	}
	return t
}

// StdioEnv is the environment entry ("NAME=secret") a stdio upstream is
// started with, or nil.
func (b *Broker) StdioEnv(serverID string) []string {
	if s := b.cfg.servers[serverID]; s != nil && s.mode == schemas.TokenModeSecret && s.stdioEnv != "" {
		return []string{s.stdioEnv + "=" + s.secret.get()}
	}
	return nil
}
