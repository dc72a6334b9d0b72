package receipts

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// TimeLayout is the CloudEvent time format: RFC 3339, milliseconds, UTC.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Meta is the CloudEvent context of an event to sign.
type Meta struct {
	Type    string    // a schemas.Type* name
	Source  string    // talos://<role>/<instance>
	Subject string    // the tool_call_id, or the control verb; empty omits it
	Time    time.Time // zero → time.Now(); written in TimeLayout (truncated to ms)
	ID      string    // empty → a new UUIDv7
}

// Sealed is a signed CloudEvent ready to publish.
type Sealed struct {
	ID   string // CloudEvent id
	Seq  uint64 // chain seq (0 for events signed outside a chain)
	Hash string // receipt hash: lowercase hex sha256 of the signed bytes
	// JSON is the event exactly as it must be published and stored: RFC
	// 8785 canonical, and equal to the signed bytes plus data.signature.
	JSON []byte

	ChainID  string // empty for events signed outside a chain
	PrevHash string // chain prev_hash (empty outside a chain)
	KID      string // key id of the signer
}

// SignEvent signs a CloudEvent whose data is v, which MUST encode (see
// jsonkit.MarshalCanonical) as a JSON object without a "signature" member; the
// signature is added as data.signature. Use it for signed events outside a
// receipt chain (control events, checkpoints); receipts go through
// Chain.Seal.
func SignEvent(key *PrivateKey, meta Meta, v any) (*Sealed, error) {
	s, _, err := signEvent(key, meta, v, 0)
	return s, err
}

// eventContext is the context of an event to sign, checked and normalized.
type eventContext struct {
	id, source, typ, subject string
	time                     time.Time
}

// newContext checks meta with the CloudEvents 1.0 rules the CloudEvents Go
// SDK applies (and that Talos events have always been signed under): id,
// type and subject are trimmed of surrounding white space; source is
// parsed as a URI reference and written in its normalized form; id, source
// and type MUST then be non-empty; an empty subject is left out. A missing
// id is a new UUIDv7 and a zero time is the current time.
func newContext(meta Meta) (eventContext, error) {
	c := eventContext{id: meta.ID, typ: strings.TrimSpace(meta.Type), subject: strings.TrimSpace(meta.Subject), time: meta.Time}
	if c.id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return c, fmt.Errorf("receipts: sign: new id: %w", err)
		}
		c.id = u.String()
	} else {
		c.id = strings.TrimSpace(c.id)
	}
	if c.time.IsZero() {
		c.time = time.Now()
	}
	var problems []string
	if c.id == "" {
		problems = append(problems, "id: MUST be a non-empty string")
	}
	src, err := normalizeSource(meta.Source)
	switch {
	case err != nil:
		problems = append(problems, "source: "+err.Error())
	case strings.TrimSpace(src) == "":
		problems = append(problems, "source: REQUIRED")
	}
	c.source = src
	if c.typ == "" {
		problems = append(problems, "type: MUST be a non-empty string")
	}
	if problems != nil {
		return c, fmt.Errorf("receipts: sign: invalid CloudEvent context: %s", strings.Join(problems, "; "))
	}
	return c, nil
}

// normalizeSource is the source attribute as a URI reference serializes:
// url.Parse, then String. The common talos://<role>/<instance> form, which
// that leaves as it is, skips the parse.
func normalizeSource(s string) (string, error) {
	if plainSource(s) {
		return s, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// plainSource reports whether s is scheme://host[/path] with a lowercase
// scheme and only unreserved characters (RFC 3986) in host and path: a
// URI that url.Parse and String return unchanged.
func plainSource(s string) bool {
	i := 0
	for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || i > 0 && (s[i] >= '0' && s[i] <= '9' || s[i] == '+' || s[i] == '-' || s[i] == '.')) {
		i++
	}
	if i == 0 || !strings.HasPrefix(s[i:], "://") {
		return false
	}
	i += 3
	host := i
	for i < len(s) && unreserved(s[i]) {
		i++
	}
	if i == host || i < len(s) && s[i] != '/' {
		return false
	}
	for ; i < len(s); i++ {
		if !unreserved(s[i]) && s[i] != '/' {
			return false
		}
	}
	return true
}

// unreserved is RFC 3986's unreserved set: ALPHA / DIGIT / "-" / "." /
// "_" / "~".
func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// signatureKey is the data member a signature is written to.
const signatureKey = "signature"

// sigMemberPrefix starts the data.signature member; the kid, the sig and
// `"}` follow.
const sigMemberPrefix = `"signature":{"alg":"` + schemas.SignatureAlg + `","kid":`

// sigLen is the length of a base64url (unpadded) Ed25519 signature.
var sigLen = base64.RawURLEncoding.EncodedLen(ed25519.SignatureSize)

// signEvent writes the canonical event without data.signature into one
// buffer, hashes and signs it, and inserts data.signature into the same
// buffer at its sorted place. sizeHint (0: unknown) is the expected length
// of the result.
func signEvent(key *PrivateKey, meta Meta, v any, sizeHint int) (*Sealed, *schemas.Signature, error) {
	if key == nil || len(key.Key) != ed25519.PrivateKeySize || key.KID == "" {
		return nil, nil, errors.New("receipts: sign: no valid signing key")
	}
	ctx, err := newContext(meta)
	if err != nil {
		return nil, nil, err
	}
	// sizeHint is the length of an earlier event like this one (0: none);
	// the slack absorbs ids, codes and names of other lengths.
	capacity := 4096
	if sizeHint > 0 {
		capacity = sizeHint + sizeHint/32 + 128
	}

	// Canonical event without data.signature; members in RFC 8785 order:
	// data, datacontenttype, id, source, specversion, subject, time, type.
	buf := append(make([]byte, 0, capacity), `{"data":`...)
	buf, at, found, err := jsonkit.AppendCanonicalObject(buf, v, signatureKey)
	if err != nil {
		return nil, nil, fmt.Errorf("receipts: sign: %w", err)
	}
	if at < 0 {
		return nil, nil, errors.New("receipts: sign: data must be a JSON object")
	}
	if found {
		return nil, nil, errors.New("receipts: sign: data already has a signature member")
	}
	buf = appendAttributes(buf, ctx)

	sum := sha256.Sum256(buf)
	sig := Sign(key.Key, sum[:])

	buf, sigAt, err := insertSignature(buf, at, key.KID, sig)
	if err != nil {
		return nil, nil, err
	}

	s := &Sealed{ID: ctx.id, Hash: hex.EncodeToString(sum[:]), JSON: buf, KID: key.KID}
	return s, &schemas.Signature{Alg: schemas.SignatureAlg, KID: key.KID, Sig: string(buf[sigAt : sigAt+sigLen])}, nil
}

// appendAttributes appends the members that follow data in a canonical
// event (datacontenttype, id, source, specversion, subject, time, type)
// and closes the event.
func appendAttributes(buf []byte, ctx eventContext) []byte {
	buf = append(buf, `,"datacontenttype":"`+verify.ContentType+`","id":`...)
	buf = jsonkit.AppendString(buf, ctx.id)
	buf = append(buf, `,"source":`...)
	buf = jsonkit.AppendString(buf, ctx.source)
	buf = append(buf, `,"specversion":"1.0"`...)
	if ctx.subject != "" {
		buf = append(buf, `,"subject":`...)
		buf = jsonkit.AppendString(buf, ctx.subject)
	}
	buf = append(buf, `,"time":"`...)
	buf = appendEventTime(buf, ctx.time)
	buf = append(buf, `","type":`...)
	buf = jsonkit.AppendString(buf, ctx.typ)
	buf = append(buf, '}')
	return buf
}

// insertSignature inserts the data.signature member of key kid and
// signature sig into buf at offset at, its sorted place in data, in place:
// it moves the tail right and writes the member into the gap. It returns
// buf and the offset of the base64url signature in it.
func insertSignature(buf []byte, at int, kid string, sig []byte) ([]byte, int, error) {
	var kidBuf [64]byte
	quotedKID := jsonkit.AppendString(kidBuf[:0], kid)
	atEnd := buf[at] == '}'
	lead := atEnd && buf[at-1] != '{'
	insLen := len(sigMemberPrefix) + len(quotedKID) + len(`,"sig":"`) + sigLen + len(`"}`)
	if lead || !atEnd {
		insLen++ // the comma before or after the member
	}
	n := len(buf)
	buf = slices.Grow(buf, insLen)[:n+insLen]
	copy(buf[at+insLen:], buf[at:n])
	w := buf[at:at]
	if lead {
		w = append(w, ',')
	}
	w = append(w, sigMemberPrefix...)
	w = append(w, quotedKID...)
	w = append(w, `,"sig":"`...)
	sigAt := at + len(w)
	w = base64.RawURLEncoding.AppendEncode(w, sig)
	w = append(w, `"}`...)
	if !atEnd {
		w = append(w, ',')
	}
	if len(w) != insLen {
		return nil, 0, errors.New("receipts: sign: signature member length miscounted")
	}
	return buf, sigAt, nil
}

// appendEventTime appends t in TimeLayout: UTC, truncated to the
// millisecond.
func appendEventTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimeLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	return append(b,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}
