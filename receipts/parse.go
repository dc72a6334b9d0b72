package receipts

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"

	"github.com/talos-audit/talos/schemas"
)

// parseSigned reads a signed event in one pass, as VerifyEvent does up to
// its signature check, and returns the check still to make. It handles
// events exactly as Talos publishes them: canonical bytes whose top-level
// members are CloudEvents attributes Talos writes (data, datacontenttype,
// id, source, specversion, subject, time, type; strings but data) and that
// verifyEventGeneral would accept up to the signature. For anything else
// (another form, an unknown key, any problem before the signature) it
// reports ok false and the caller runs verifyEventGeneral, so the result
// of VerifyEvent, errors included, never depends on which path ran.
//
// The returned Event has Canonical set.
func parseSigned(raw []byte, keys KeySet) (ev *Event, chk SigCheck, ok bool) {
	s := string(raw)
	d := canonDecoder{b: raw, s: s}
	var (
		w                    wireEvent
		dataStart, dataEnd   int
		subject, tm, ctype   string
		hasSubj, hasT, hasCT bool
	)
	// One pass checks the form and reads the attributes.
	attrs := func(name []byte, start, end int) bool {
		if string(name) == "data" {
			dataStart, dataEnd = start, end
			return raw[start] == '{'
		}
		d.i = start
		v, isStr := d.str()
		if !isStr {
			return false
		}
		switch string(name) {
		case "datacontenttype":
			ctype, hasCT = v, true
		case "id":
			w.ID = v
		case "source":
			w.Source = v
		case "specversion":
			w.SpecVersion = v
		case "subject":
			subject, hasSubj = v, true
		case "time":
			tm, hasT = v, true
		case "type":
			w.Type = v
		default:
			return false
		}
		return true
	}
	if !canonicalMembers(raw, attrs) {
		return nil, chk, false
	}
	if dataEnd == 0 {
		return nil, chk, false
	}
	if hasSubj {
		w.Subject = &subject
	}
	if hasT {
		w.Time = &tm
	}
	if hasCT {
		w.DataContentType = &ctype
	}

	ev = &Event{ID: w.ID, Type: w.Type, Source: w.Source, Canonical: true,
		RawData: raw[dataStart:dataEnd:dataEnd]}
	if w.Subject != nil {
		ev.Subject = *w.Subject
	}
	if w.Time != nil {
		ev.Time = *w.Time
	}
	// The data (a receipt's, read whole) and data.signature, whose range
	// the hash leaves out.
	var (
		sig                           schemas.Signature
		sigStart, sigValStart, sigEnd int
	)
	if isReceiptType(w.Type) {
		var read bool
		sigStart, sigValStart, sigEnd, read = decodeSigned(raw, s, dataStart, dataEnd, &ev.Data)
		if !read || sigStart < 0 || raw[sigValStart] != '{' {
			return nil, chk, false
		}
		sig = *ev.Data.Signature
	} else {
		sigStart = -1
		for i := dataStart + 1; raw[i] != '}'; {
			keyEnd, err := skipString(raw, i)
			if err != nil {
				return nil, chk, false
			}
			valEnd, err := skipValue(raw, keyEnd+1)
			if err != nil {
				return nil, chk, false
			}
			if string(raw[i+1:keyEnd-1]) == signatureKey {
				sigStart, sigValStart, sigEnd = i, keyEnd+1, valEnd
			}
			i = valEnd
			if raw[i] == ',' {
				i++
			}
		}
		if sigStart < 0 || raw[sigValStart] != '{' || !decodeCanonical(raw, s, sigValStart, sigEnd, &sig) {
			return nil, chk, false
		}
	}
	if checkContext(&w) != nil {
		return nil, chk, false
	}
	if isReceiptType(w.Type) {
		c := ev.Data.Chain
		if c.ChainID == "" || c.Seq == 0 || !isHexHash(c.PrevHash) {
			return nil, chk, false
		}
	}
	if sig.Alg != schemas.SignatureAlg {
		return nil, chk, false
	}
	pub, known := keys[sig.KID]
	if !known {
		return nil, chk, false
	}
	sigBytes, err := base64.RawURLEncoding.DecodeString(sig.Sig)
	if err != nil || len(sigBytes) != ed25519.SignatureSize {
		return nil, chk, false
	}

	// The receipt hash: the event without data.signature.
	sum := hashWithout(raw, member{start: sigStart, valStart: sigValStart, end: sigEnd})
	ev.Hash = hex.EncodeToString(sum[:])
	ev.KID = sig.KID
	return ev, SigCheck{Pub: pub, Message: sum[:], Sig: sigBytes}, true
}
