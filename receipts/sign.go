package receipts

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"

	"github.com/talos-audit/talos/schemas"
)

// TimeLayout is the CloudEvent time format: RFC 3339, milliseconds, UTC.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// ContentType is the datacontenttype of every Talos CloudEvent.
const ContentType = "application/json"

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
// MarshalCanonical) as a JSON object without a "signature" member; the
// signature is added as data.signature. Use it for signed events outside a
// receipt chain (control events, checkpoints); receipts go through
// Chain.Seal.
func SignEvent(key *PrivateKey, meta Meta, v any) (*Sealed, error) {
	s, _, err := signEvent(key, meta, v)
	return s, err
}

func signEvent(key *PrivateKey, meta Meta, v any) (*Sealed, *schemas.Signature, error) {
	if key == nil || len(key.Key) != ed25519.PrivateKeySize || key.KID == "" {
		return nil, nil, errors.New("receipts: sign: no valid signing key")
	}
	id := meta.ID
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, nil, fmt.Errorf("receipts: sign: new id: %w", err)
		}
		id = u.String()
	}
	t := meta.Time
	if t.IsZero() {
		t = time.Now()
	}

	// The SDK builds and validates the context; the bytes are written here,
	// canonically, from the values the SDK accepted.
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetID(id)
	ev.SetSource(meta.Source)
	ev.SetType(meta.Type)
	ev.SetSubject(meta.Subject)
	ev.SetTime(t)
	ev.SetDataContentType(ContentType)
	if err := ev.Validate(); err != nil {
		return nil, nil, fmt.Errorf("receipts: sign: invalid CloudEvent context: %w", err)
	}

	// Canonical event without data.signature; members in RFC 8785 order:
	// data, datacontenttype, id, source, specversion, subject, time, type.
	buf := make([]byte, 0, 2048+512)
	buf = append(buf, `{"data":`...)
	dataStart := len(buf)
	var err error
	if buf, err = appendCanonical(buf, v); err != nil {
		return nil, nil, fmt.Errorf("receipts: sign: %w", err)
	}
	if buf[dataStart] != '{' {
		return nil, nil, errors.New("receipts: sign: data must be a JSON object")
	}
	buf = append(buf, `,"datacontenttype":"`+ContentType+`","id":`...)
	buf = appendJCSString(buf, ev.ID())
	buf = append(buf, `,"source":`...)
	buf = appendJCSString(buf, ev.Source())
	buf = append(buf, `,"specversion":"1.0"`...)
	if subj := ev.Subject(); subj != "" {
		buf = append(buf, `,"subject":`...)
		buf = appendJCSString(buf, subj)
	}
	buf = append(buf, `,"time":"`...)
	buf = t.UTC().AppendFormat(buf, TimeLayout)
	buf = append(buf, `","type":`...)
	buf = appendJCSString(buf, ev.Type())
	buf = append(buf, '}')

	m, found, _, err := findMember(buf, dataStart, "signature")
	if err != nil {
		return nil, nil, fmt.Errorf("receipts: sign: %w", err)
	}
	if found {
		return nil, nil, errors.New("receipts: sign: data already has a signature member")
	}

	sum := sha256.Sum256(buf)
	sig := &schemas.Signature{
		Alg: schemas.SignatureAlg,
		KID: key.KID,
		Sig: base64.RawURLEncoding.EncodeToString(ed25519.Sign(key.Key, sum[:])),
	}

	// Insert `"signature":{...}` at its sorted place in data.
	ins := make([]byte, 0, 160)
	atEnd := buf[m.start] == '}'
	if atEnd && buf[m.start-1] != '{' {
		ins = append(ins, ',')
	}
	ins = append(ins, `"signature":{"alg":`...)
	ins = appendJCSString(ins, sig.Alg)
	ins = append(ins, `,"kid":`...)
	ins = appendJCSString(ins, sig.KID)
	ins = append(ins, `,"sig":"`...)
	ins = append(ins, sig.Sig...)
	ins = append(ins, `"}`...)
	if !atEnd {
		ins = append(ins, ',')
	}
	out := make([]byte, 0, len(buf)+len(ins))
	out = append(out, buf[:m.start]...)
	out = append(out, ins...)
	out = append(out, buf[m.start:]...)

	return &Sealed{ID: ev.ID(), Hash: hex.EncodeToString(sum[:]), JSON: out, KID: key.KID}, sig, nil
}
