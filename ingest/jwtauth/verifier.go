// Package jwtauth verifies JWT bearer tokens (RFC 7519) for an HTTP
// enforcement point (CSP MUST 2): the signature against an issuer's JSON
// Web Key Set, read from a file or fetched over HTTPS and kept current
// (KeySet), with an explicit list of asymmetric algorithms, and the
// issuer, audience and validity window of the claims. A token that fails
// any check is refused with a stable Reason; nothing here ever accepts a
// token it could not check (no keys, stale keys, an unknown key: refused).
package jwtauth

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Reason is why a token was refused: stable, for logs, metrics and the
// audit record, never echoing the token.
type Reason string

// The reasons a token is refused.
const (
	Malformed           Reason = "malformed_token"
	AlgorithmNotAllowed Reason = "algorithm_not_allowed"
	UnknownKey          Reason = "unknown_key"
	KeysUnavailable     Reason = "keys_unavailable"
	BadSignature        Reason = "invalid_signature"
	NoExpiry            Reason = "no_expiry"
	Expired             Reason = "expired"
	NotYetValid         Reason = "not_yet_valid"
	WrongIssuer         Reason = "wrong_issuer"
	WrongAudience       Reason = "wrong_audience"
)

// Error is a refused token.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return "jwt refused (" + string(e.Reason) + "): " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ReasonOf is the Reason of an error from Verify (Malformed for another).
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return Malformed
}

// DefaultAlgorithms are the signature algorithms accepted unless Options
// say otherwise.
var DefaultAlgorithms = []string{"RS256", "ES256", "EdDSA"}

// allowed are the algorithms Options may name: asymmetric only, so a
// public key can never be used as an HMAC secret, and never "none".
var allowed = map[string]jose.SignatureAlgorithm{
	"RS256": jose.RS256, "RS384": jose.RS384, "RS512": jose.RS512,
	"PS256": jose.PS256, "PS384": jose.PS384, "PS512": jose.PS512,
	"ES256": jose.ES256, "ES384": jose.ES384, "ES512": jose.ES512,
	"EdDSA": jose.EdDSA,
}

// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
const DefaultLeeway = 30 * time.Second

// Options configure a Verifier; Issuer, Audience and Keys are required.
type Options struct {
	Issuer   string // the iss every token must carry
	Audience string // a value the token's aud must contain
	// Algorithms allowed (DefaultAlgorithms); asymmetric ones only.
	Algorithms []string
	Leeway     time.Duration // DefaultLeeway
	Keys       *KeySet
	Now        func() time.Time // default time.Now
}

// Claims are what a verified token says of its bearer.
type Claims struct {
	Subject string
	Issuer  string
	Expiry  time.Time
	// Extra holds every claim, registered ones included, as decoded JSON.
	Extra map[string]any
}

// Verifier checks bearer tokens. It is safe for concurrent use.
type Verifier struct {
	o    Options
	algs []jose.SignatureAlgorithm
}

// NewVerifier checks o.
func NewVerifier(o Options) (*Verifier, error) {
	if o.Issuer == "" || o.Audience == "" {
		return nil, errors.New("jwtauth: an issuer and an audience are required")
	}
	if o.Keys == nil {
		return nil, errors.New("jwtauth: a key set is required")
	}
	if len(o.Algorithms) == 0 {
		o.Algorithms = DefaultAlgorithms
	}
	v := &Verifier{o: o}
	for _, a := range o.Algorithms {
		alg, ok := allowed[a]
		if !ok {
			return nil, fmt.Errorf("jwtauth: algorithm %q is not allowed (asymmetric signatures only: %s)", a, strings.Join(slices.Sorted(maps.Keys(allowed)), ", "))
		}
		v.algs = append(v.algs, alg)
	}
	if o.Leeway <= 0 {
		v.o.Leeway = DefaultLeeway
	}
	if o.Now == nil {
		v.o.Now = time.Now
	}
	return v, nil
}

// Verify checks token and returns its claims, or an *Error naming why it
// is refused.
func (v *Verifier) Verify(token string) (*Claims, error) {
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		if strings.Contains(err.Error(), "unexpected signature algorithm") {
			return nil, &Error{Reason: AlgorithmNotAllowed, Err: err}
		}
		return nil, &Error{Reason: Malformed, Err: err}
	}
	if len(tok.Headers) != 1 {
		return nil, &Error{Reason: Malformed, Err: errors.New("exactly one signature is required")}
	}
	h := tok.Headers[0]
	key, err := v.o.Keys.lookup(h.KeyID, h.Algorithm)
	if err != nil {
		return nil, err
	}
	var std jwt.Claims
	extra := map[string]any{}
	if err := tok.Claims(key.Key, &std, &extra); err != nil {
		return nil, &Error{Reason: BadSignature, Err: err}
	}
	if std.Expiry == nil {
		return nil, &Error{Reason: NoExpiry, Err: errors.New("the token has no exp")}
	}
	want := jwt.Expected{Issuer: v.o.Issuer, AnyAudience: jwt.Audience{v.o.Audience}, Time: v.o.Now()}
	if err := std.ValidateWithLeeway(want, v.o.Leeway); err != nil {
		return nil, &Error{Reason: validationReason(err), Err: err}
	}
	return &Claims{Subject: std.Subject, Issuer: std.Issuer, Expiry: std.Expiry.Time(), Extra: extra}, nil
}

func validationReason(err error) Reason {
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return Expired
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return NotYetValid
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return WrongIssuer
	case errors.Is(err, jwt.ErrInvalidAudience):
		return WrongAudience
	}
	return Malformed
}
