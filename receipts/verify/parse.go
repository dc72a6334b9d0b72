package verify

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
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
	var w wireEvent
	dataStart, dataEnd, ok := readAttributes(raw, s, &w)
	if !ok {
		return nil, chk, false
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
		var found bool
		sigStart, sigValStart, sigEnd, found = signatureMember(raw, dataStart)
		if !found || raw[sigValStart] != '{' || !decodeCanonical(raw, s, sigValStart, sigEnd, &sig) {
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
	sum := hashWithout(raw, jsonkit.Member{Start: sigStart, ValStart: sigValStart, End: sigEnd})
	ev.Hash = hex.EncodeToString(sum[:])
	ev.KID = sig.KID
	return ev, SigCheck{Pub: pub, Message: sum[:], Sig: sigBytes}, true
}

// readAttributes checks that raw (whose bytes s holds) is a canonical
// object of the attributes parseSigned takes, reads them into w, and
// returns the range of the value of data, which must be an object.
func readAttributes(raw []byte, s string, w *wireEvent) (dataStart, dataEnd int, ok bool) {
	d := canonDecoder{b: raw, s: s}
	attr := func(name []byte, start, end int) bool {
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
			w.DataContentType = new(v)
		case "id":
			w.ID = v
		case "source":
			w.Source = v
		case "specversion":
			w.SpecVersion = v
		case "subject":
			w.Subject = new(v)
		case "time":
			w.Time = new(v)
		case "type":
			w.Type = v
		default:
			return false
		}
		return true
	}
	if !jsonkit.CanonicalMembers(raw, attr) || dataEnd == 0 {
		return 0, 0, false
	}
	return dataStart, dataEnd, true
}

// signatureMember finds the signature member of the canonical data object
// that starts at raw[dataStart]: the offsets of its key, of its value and
// of the end of its value. found is false when data has none or does not
// scan.
func signatureMember(raw []byte, dataStart int) (start, valStart, end int, found bool) {
	start = -1
	for i := dataStart + 1; raw[i] != '}'; {
		keyEnd, err := jsonkit.SkipString(raw, i)
		if err != nil {
			return -1, 0, 0, false
		}
		valEnd, err := jsonkit.SkipValue(raw, keyEnd+1)
		if err != nil {
			return -1, 0, 0, false
		}
		if string(raw[i+1:keyEnd-1]) == signatureKey {
			start, valStart, end = i, keyEnd+1, valEnd
		}
		i = valEnd
		if raw[i] == ',' {
			i++
		}
	}
	return start, valStart, end, start >= 0
}
