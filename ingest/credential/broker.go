package credential

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/talos-audit/talos/schemas"
)

// Errors a Resolve can end in; the call is then denied. Each is also
// named in the call's TokenHandling (PassthroughDetected, Error).
var (
	// ErrPassthrough: the credential to send equals the client's own token.
	ErrPassthrough = errors.New("credential: the upstream credential equals the client's token")
	// ErrNoSubjectToken: token_exchange, but the caller presented no JWT.
	ErrNoSubjectToken = errors.New("credential: no client JWT to exchange")
	// ErrExchange: the token endpoint refused or did not answer.
	ErrExchange = errors.New("credential: token exchange failed")
	// ErrSessionToken: in mode token_exchange, the token endpoint did not
	// grant the gateway its own token for the session's requests; the
	// request to the upstream is not sent.
	ErrSessionToken = errors.New("credential: no session token")
)

// RFC 8693 token type identifiers the broker uses.
const (
	TokenTypeJWT         = "urn:ietf:params:oauth:token-type:jwt"
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
)

// Options configure a Broker. Zero values mean the defaults.
type Options struct {
	// HTTPClient reaches the token endpoints (default: a client of its
	// own; each exchange is bounded by its server's timeout).
	HTTPClient *http.Client
	// RefreshBefore is how long before its expiry a cached exchanged token
	// is exchanged again (default 30 s).
	RefreshBefore time.Duration
	// DefaultLifetime is how long an exchanged token without expires_in is
	// cached (default 1 min).
	DefaultLifetime time.Duration
	Now             func() time.Time
}

// Broker hands out the credential of each upstream server per call, and
// of its session's own requests (Transport). It is safe for concurrent
// use; exchanged tokens are cached per (principal, server) until shortly
// before they expire, and a new client token for the same principal
// replaces the cached one; the gateway's own session token is cached per
// server the same way.
type Broker struct {
	cfg *Config
	o   Options

	mu    sync.Mutex
	cache map[cacheKey]*cached
}

// cacheKey is a (principal, server) pair's exchanged token, or with own
// set (and no principal) the server's session token.
type cacheKey struct {
	principal, server string
	own               bool
}

// cached is one token from the token endpoint; mu serialises its requests
// so callers of one key wait for one request rather than each making one.
type cached struct {
	mu      sync.Mutex
	subject [32]byte // sha256 of the client token it was exchanged for
	token   string
	expiry  time.Time
}

// entry is key's cache entry, created empty when absent.
func (b *Broker) entry(key cacheKey) *cached {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.cache[key]
	if e == nil {
		e = &cached{}
		b.cache[key] = e
	}
	return e
}

// renew is e's token when it was obtained for subject and is not within
// RefreshBefore of its expiry; else the one fetch obtains, then cached in
// e (an answer without expires_in for DefaultLifetime). A failed fetch
// leaves e empty: nothing stale is served after it.
func (b *Broker) renew(e *cached, subject [32]byte, fetch func() (*oauth2.Token, error)) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := b.o.Now()
	if e.token != "" && e.subject == subject && now.Before(e.expiry.Add(-b.o.RefreshBefore)) {
		return e.token, nil
	}
	e.token = ""
	tok, err := fetch()
	if err != nil {
		return "", err
	}
	if tok.AccessToken == "" {
		return "", errors.New("the token endpoint issued an empty token")
	}
	// The library dates Expiry by the wall clock; the cache by b.o.Now.
	expiry := now.Add(time.Until(tok.Expiry))
	if tok.Expiry.IsZero() {
		expiry = now.Add(b.o.DefaultLifetime + b.o.RefreshBefore)
	}
	e.subject, e.token, e.expiry = subject, tok.AccessToken, expiry
	return tok.AccessToken, nil
}

// New is a broker over a loaded configuration (nil: every server is mode
// none).
func New(cfg *Config, o Options) *Broker {
	if cfg == nil {
		cfg = &Config{servers: map[string]*server{}}
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{}
	}
	if o.RefreshBefore <= 0 {
		o.RefreshBefore = 30 * time.Second
	}
	if o.DefaultLifetime <= 0 {
		o.DefaultLifetime = time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Broker{cfg: cfg, o: o, cache: map[cacheKey]*cached{}}
}

// Request is one call's need for an upstream credential.
type Request struct {
	Principal string // the principal's name (the cache key)
	ServerID  string
	// Inbound is the client's own bearer token as it presented it ("" for
	// the stdio session); never sent upstream.
	Inbound string
	// SubjectToken is the client's validated JWT, the token exchanged in
	// mode token_exchange; "" when the caller presented none (stdio, or a
	// principal's static token, which never leaves the gateway).
	SubjectToken string
}

// Credential is what the gateway sends the upstream for one call: Token
// (empty in mode none) and how it was obtained.
type Credential struct {
	Token    string
	Handling schemas.TokenHandling
}

// Declared is the handling a server's calls get, without obtaining a
// credential: for calls refused before one is needed.
func (b *Broker) Declared(serverID string) schemas.TokenHandling {
	s := b.cfg.servers[serverID]
	if s == nil || s.mode == schemas.TokenModeNone {
		return schemas.TokenHandling{Mode: schemas.TokenModeNone}
	}
	return schemas.TokenHandling{Mode: s.mode, Audience: s.audience}
}

// Resolve obtains the credential for r (CSP MUST 5). It fails with
// ErrPassthrough when that credential equals the client's own token
// (compared in constant time), ErrNoSubjectToken or ErrExchange; the
// returned Credential's Handling says so in every case, and its Token is
// then empty.
func (b *Broker) Resolve(ctx context.Context, r Request) (Credential, error) {
	c := Credential{Handling: b.Declared(r.ServerID)}
	s := b.cfg.servers[r.ServerID]
	if s == nil || s.mode == schemas.TokenModeNone {
		return c, nil
	}
	var tok string
	switch s.mode {
	case schemas.TokenModeSecret:
		tok = s.secret.get()
	case schemas.TokenModeTokenExchange:
		if r.SubjectToken == "" {
			c.Handling.Error = schemas.TokenErrNoSubjectToken
			return c, ErrNoSubjectToken
		}
		var err error
		if tok, err = b.exchanged(ctx, s, r); err != nil {
			c.Handling.Error = schemas.TokenErrEndpointUnreachable
			var re *oauth2.RetrieveError
			if errors.As(err, &re) || !errors.Is(err, errUnreachable) {
				c.Handling.Error = schemas.TokenErrExchangeRefused
			}
			return c, fmt.Errorf("%w: %v", ErrExchange, err)
		}
	}
	if Same(tok, r.Inbound) || Same(tok, r.SubjectToken) {
		c.Handling.PassthroughDetected = true
		return c, ErrPassthrough
	}
	c.Token = tok
	return c, nil
}

// SecretDigests is, by server_id, the hex sha256 of each mode secret
// server's secret as it is now: for comparing it with tokens known only
// by their hash (a principal's token_sha256) without handing it out.
func (b *Broker) SecretDigests() map[string]string {
	out := map[string]string{}
	for id, s := range b.cfg.servers {
		if s.mode == schemas.TokenModeSecret {
			sum := sha256.Sum256([]byte(s.secret.get()))
			out[id] = hex.EncodeToString(sum[:])
		}
	}
	return out
}

// Same reports, in constant time for tokens of equal length, whether a
// non-empty outbound credential equals an inbound token.
func Same(outbound, inbound string) bool {
	if outbound == "" || inbound == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(outbound), []byte(inbound)) == 1
}

// errUnreachable marks an exchange that got no HTTP answer.
var errUnreachable = errors.New("token endpoint unreachable")

// exchanged is the cached exchanged token of (principal, server) for this
// subject token, exchanged again when absent, for another subject token,
// or within RefreshBefore of its expiry.
func (b *Broker) exchanged(ctx context.Context, s *server, r Request) (string, error) {
	e := b.entry(cacheKey{principal: r.Principal, server: r.ServerID})
	return b.renew(e, sha256.Sum256([]byte(r.SubjectToken)), func() (*oauth2.Token, error) {
		return b.exchange(ctx, s, r.SubjectToken)
	})
}

// exchange is one RFC 8693 request: grant_type token-exchange, the client's
// JWT as subject_token, the server's audience and resource, the gateway's
// client credentials (client_secret_post). It uses the MCP SDK's
// oauthex.ExchangeToken, which also requires issued_token_type in the
// answer as RFC 8693 does.
func (b *Broker) exchange(ctx context.Context, s *server, subject string) (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	creds := &oauthex.ClientCredentials{ClientID: s.clientID}
	if cs := s.clientSecret.get(); cs != "" {
		creds.ClientSecretAuth = &oauthex.ClientSecretAuth{ClientSecret: cs}
	}
	hc := *b.o.HTTPClient
	hc.Transport = reachability{next: hc.Transport}
	return oauthex.ExchangeToken(ctx, s.endpoint, &oauthex.TokenExchangeRequest{
		RequestedTokenType: TokenTypeAccessToken,
		Audience:           s.audience,
		Resource:           s.resource,
		Scope:              s.scope,
		SubjectToken:       subject,
		SubjectTokenType:   TokenTypeJWT,
	}, creds, &hc)
}

// SessionToken is the gateway's own token for the session requests of
// serverID (initialize, tools/list, its stream), in mode token_exchange
// with session client_credentials; "" for any other server. It is
// obtained with the client credentials grant (RFC 6749 §4.4) at the
// server's token_endpoint, with the gateway's client credentials and the
// audience, resource and scope an exchange asks for, and cached until
// RefreshBefore its expiry. It is never a client's token: no client token
// is sent to obtain it. A refused or failed grant is ErrSessionToken,
// naming the server, the endpoint and the endpoint's error.
func (b *Broker) SessionToken(ctx context.Context, serverID string) (string, error) {
	s := b.cfg.servers[serverID]
	if s == nil || s.mode != schemas.TokenModeTokenExchange || !s.ownSession {
		return "", nil
	}
	tok, err := b.renew(b.entry(cacheKey{server: serverID, own: true}), [32]byte{}, func() (*oauth2.Token, error) {
		return b.clientCredentials(ctx, s)
	})
	if err != nil {
		return "", fmt.Errorf("%w for %s: the client credentials grant at %s failed: %v", ErrSessionToken, serverID, s.endpoint, err)
	}
	return tok, nil
}

// clientCredentials is one client credentials request (grant_type
// client_credentials) for the gateway itself, bound like an exchange:
// the server's audience, resource and scope, client_secret_post.
func (b *Broker) clientCredentials(ctx context.Context, s *server) (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	cc := clientcredentials.Config{ClientID: s.clientID, ClientSecret: s.clientSecret.get(), TokenURL: s.endpoint,
		Scopes: s.scope, AuthStyle: oauth2.AuthStyleInParams,
		EndpointParams: url.Values{"audience": {s.audience}, "resource": {s.resource}}}
	return cc.Token(context.WithValue(ctx, oauth2.HTTPClient, b.o.HTTPClient))
}

// reachability marks a round trip that got no HTTP answer (errUnreachable),
// so an endpoint that is down is told apart from one that refuses.
type reachability struct{ next http.RoundTripper }

func (t reachability) RoundTrip(r *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnreachable, err)
	}
	if resp.StatusCode >= 500 {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: HTTP %d", errUnreachable, resp.StatusCode)
	}
	return resp, nil
}
