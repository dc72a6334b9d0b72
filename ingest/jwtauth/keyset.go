package jwtauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Defaults of KeySetOptions.
const (
	DefaultRefresh  = 5 * time.Minute
	DefaultMaxStale = 15 * time.Minute
	// minKick is the least time between two refreshes that an unknown
	// key id asks for (a rotation at the issuer), so tokens naming made-up
	// key ids cannot make the gateway fetch without end.
	minKick = 30 * time.Second
	// minRefresh is the least time between two scheduled reads of a JWKS
	// URL, whatever its Cache-Control asks (max-age=0, no-cache,
	// no-store): an issuer's header cannot make the gateway fetch
	// without end either.
	minRefresh = 30 * time.Second
	// retryFailed is the most Run waits to try again after a failed read.
	retryFailed = 10 * time.Second
	// maxJWKSBytes bounds a key set document.
	maxJWKSBytes = 1 << 20
)

// KeySetOptions say where a KeySet reads its keys and how long it trusts
// them. Exactly one of File and URL is set; zero durations mean the
// defaults.
type KeySetOptions struct {
	// File is a JWKS document on disk, read again at every refresh (so a
	// rotated file is picked up).
	File string
	// URL is the issuer's JWKS endpoint; it MUST be https.
	URL string
	// Refresh is how often the keys are read again (DefaultRefresh). A
	// JWKS URL whose response says how long it may be cached
	// (Cache-Control max-age, less its Age; no-cache and no-store: not
	// at all) is read again when that time is up, though never sooner
	// than 30 s after the last read, and never later than Refresh.
	Refresh time.Duration
	// MaxStale is how long the last keys read stay in use while reading
	// them again fails (DefaultMaxStale). Past it no key is known and
	// every token is refused (KeysUnavailable): a key the issuer may have
	// withdrawn is never trusted indefinitely.
	MaxStale time.Duration
	// HTTPClient fetches URL (default: a 10 s timeout, TLS 1.2 or later,
	// the system's roots).
	HTTPClient *http.Client
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// KeySet is the issuer's public signing keys (a JSON Web Key Set), kept
// current by Run. It is safe for concurrent use.
type KeySet struct {
	o    KeySetOptions
	kick chan struct{} // an unknown key id asks Run for a refresh

	mu      sync.Mutex
	keys    []jose.JSONWebKey // the signing keys (parseKeys)
	fetched time.Time         // last successful read; zero: never
	due     time.Time         // when the keys read last are read again
	kicked  time.Time         // last refresh an unknown key id asked for
}

// NewKeySet checks o; it reads nothing (Refresh or Run do).
func NewKeySet(o KeySetOptions) (*KeySet, error) {
	switch {
	case (o.File == "") == (o.URL == ""):
		return nil, errors.New("jwtauth: exactly one of a JWKS file and a JWKS URL is needed")
	case o.URL != "":
		u, err := url.Parse(o.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("jwtauth: JWKS URL %q: an https:// URL is required", o.URL)
		}
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	if o.MaxStale <= 0 {
		o.MaxStale = DefaultMaxStale
	}
	if o.MaxStale < o.Refresh {
		return nil, fmt.Errorf("jwtauth: the JWKS may not go stale (%s) before its next refresh (%s)", o.MaxStale, o.Refresh)
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}, Proxy: http.ProxyFromEnvironment}}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &KeySet{o: o, kick: make(chan struct{}, 1)}, nil
}

// Source names where the keys come from, for logs.
func (k *KeySet) Source() string {
	if k.o.URL != "" {
		return k.o.URL
	}
	return k.o.File
}

// Refresh reads the keys now. On failure the keys read before stay in use
// until they are MaxStale old.
func (k *KeySet) Refresh(ctx context.Context) error {
	b, next, err := k.read(ctx)
	if err != nil {
		return err
	}
	keys, err := parseKeys(b)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.keys, k.fetched = keys, k.o.Now()
	k.due = k.fetched.Add(next)
	k.mu.Unlock()
	return nil
}

// wait is how long until the keys are due to be read again: at once if
// they never were.
func (k *KeySet) wait() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fetched.IsZero() {
		return 0
	}
	return max(0, k.due.Sub(k.o.Now()))
}

// Run refreshes the keys when they are due (every Refresh, or as the JWKS
// response's Cache-Control says), and soon after a token names a key id
// the set does not hold, until ctx ends; keys never read are read at
// once. A failed read is logged and tried again within retryFailed
// (sooner than Refresh, so a gateway that started without keys does not
// refuse every caller for long). The caller owns the goroutine running
// Run.
func (k *KeySet) Run(ctx context.Context) {
	t := time.NewTimer(k.wait())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.kick:
			t.Stop()
		}
		if err := k.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			next := min(k.o.Refresh, retryFailed)
			k.o.Logger.Warn("JWKS not refreshed; the keys read before stay in use until they are stale",
				"source", k.Source(), "max_stale", k.o.MaxStale, "retry_in", next, "err", err)
			t.Reset(next)
			continue
		}
		next := k.wait()
		k.o.Logger.Debug("JWKS refreshed", "source", k.Source(), "next_in", next)
		t.Reset(next)
	}
}

// lookup is the key that may verify a signature made with alg: the key
// of id; for a token that names no key id (id ""), the one key of the set
// usable for alg, if there is exactly one (a single-key issuer).
func (k *KeySet) lookup(id, alg string) (jose.JSONWebKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.o.Now()
	if k.fetched.IsZero() || now.Sub(k.fetched) > k.o.MaxStale {
		return jose.JSONWebKey{}, &Error{Reason: KeysUnavailable, Err: fmt.Errorf("no current JWKS from %s", k.Source())}
	}
	if id == "" {
		return k.onlyKeyFor(alg, now)
	}
	i := slices.IndexFunc(k.keys, func(key jose.JSONWebKey) bool { return key.KeyID == id })
	if i < 0 {
		k.askRefresh(now)
		return jose.JSONWebKey{}, &Error{Reason: UnknownKey, Err: fmt.Errorf("key id %q is not in the JWKS", id)}
	}
	key := k.keys[i]
	if key.Algorithm != "" && key.Algorithm != alg {
		return jose.JSONWebKey{}, &Error{Reason: AlgorithmNotAllowed, Err: fmt.Errorf("key %q is for %s, the token says %s", id, key.Algorithm, alg)}
	}
	return key, nil
}

// onlyKeyFor is the one key of the set usable for alg, for a token that
// names no key id. None is UnknownKey, and asks for a refresh as an
// unknown key id does; several are UnknownKey too: the token must say
// which. k.mu is held.
func (k *KeySet) onlyKeyFor(alg string, now time.Time) (jose.JSONWebKey, error) {
	var (
		only  jose.JSONWebKey
		found int
	)
	for _, key := range k.keys {
		if usableFor(key, alg) {
			only, found = key, found+1
		}
	}
	switch found {
	case 1:
		return only, nil
	case 0:
		k.askRefresh(now)
		return jose.JSONWebKey{}, &Error{Reason: UnknownKey, Err: fmt.Errorf("the token names no key id (kid), and the JWKS holds no key for %s", alg)}
	}
	return jose.JSONWebKey{}, &Error{Reason: UnknownKey,
		Err: fmt.Errorf("the token names no key id (kid), and the JWKS holds %d keys for %s: a kid must say which", found, alg)}
}

// usableFor reports whether key may verify a signature made with alg: its
// own alg if it names one, else its type (and curve).
func usableFor(key jose.JSONWebKey, alg string) bool {
	if key.Algorithm != "" {
		return key.Algorithm == alg
	}
	switch pub := key.Key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return alg == curveAlgorithm[pub.Curve.Params().Name]
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// curveAlgorithm is the signature algorithm of each elliptic curve.
var curveAlgorithm = map[string]string{"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}

// askRefresh asks Run for a refresh, at most every minKick (a rotation at
// the issuer), so tokens naming made-up keys cannot make the gateway fetch
// without end. k.mu is held.
func (k *KeySet) askRefresh(now time.Time) {
	if now.Sub(k.kicked) < minKick {
		return
	}
	k.kicked = now
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// read is the JWKS document and how long until it is read again.
func (k *KeySet) read(ctx context.Context) ([]byte, time.Duration, error) {
	if k.o.File != "" {
		b, err := os.ReadFile(k.o.File)
		if err != nil {
			return nil, 0, fmt.Errorf("jwtauth: %w", err)
		}
		return b, k.o.Refresh, nil
	}
	b, h, err := k.fetch(ctx)
	if err != nil {
		return nil, 0, err
	}
	next := k.o.Refresh
	if life, ok := cacheLifetime(h); ok {
		next = min(next, max(life, minRefresh))
	}
	return b, next, nil
}

// fetch GETs the JWKS URL: the body and its header.
func (k *KeySet) fetch(ctx context.Context) ([]byte, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.o.URL, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Accept", "application/json, application/jwk-set+json")
	resp, err := k.o.HTTPClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("jwtauth: fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("jwtauth: fetch JWKS %s: HTTP %d", k.o.URL, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("jwtauth: fetch JWKS: %w", err)
	}
	if len(b) > maxJWKSBytes {
		return nil, nil, fmt.Errorf("jwtauth: JWKS from %s is larger than %d bytes", k.o.URL, maxJWKSBytes)
	}
	return b, resp.Header, nil
}

// parseKeys reads a JWKS document: its public signing keys. A document
// holding a private key, or two keys under one id, is refused whole; keys
// for another use than signing are left out. A key without an id can only
// verify a token that names none (KeySet.lookup).
func parseKeys(b []byte) ([]jose.JSONWebKey, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("jwtauth: JWKS: %w", err)
	}
	var keys []jose.JSONWebKey
	ids := map[string]bool{}
	for _, key := range set.Keys {
		if !key.IsPublic() {
			return nil, errors.New("jwtauth: JWKS holds a private key; publish only public keys")
		}
		if key.Use != "" && key.Use != "sig" {
			continue
		}
		if key.KeyID != "" && ids[key.KeyID] {
			return nil, fmt.Errorf("jwtauth: JWKS has two keys with id %q", key.KeyID)
		}
		ids[key.KeyID] = true
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("jwtauth: JWKS has no signing key")
	}
	return keys, nil
}

// cacheLifetime is how long a JWKS response may be used before it is read
// again, by its Cache-Control (RFC 9111): max-age less the response's Age;
// none with no-cache or no-store, or a max-age that cannot be read. ok is
// false when it says none of these.
func cacheLifetime(h http.Header) (life time.Duration, ok bool) {
	maxAge := int64(-1)
	for _, d := range strings.Split(strings.Join(h.Values("Cache-Control"), ","), ",") {
		name, val, _ := strings.Cut(strings.TrimSpace(d), "=")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "no-cache", "no-store":
			return 0, true
		case "max-age":
			maxAge = max(seconds(val), 0)
		}
	}
	if maxAge < 0 {
		return 0, false
	}
	if age := seconds(h.Get("Age")); age > 0 {
		maxAge = max(maxAge-age, 0)
	}
	return time.Duration(maxAge) * time.Second, true
}

// seconds reads a delta-seconds value (RFC 9111 §1.2.2): -1 if it is
// not one, at most 2^31.
func seconds(v string) int64 {
	v = strings.Trim(strings.TrimSpace(v), `"`)
	if v == "" || strings.TrimLeft(v, "0123456789") != "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > 1<<31 {
		return 1 << 31
	}
	return n
}
