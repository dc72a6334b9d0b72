package verify_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// signedSamples are signed events of every kind the verifier meets, as
// published (canonical), for the tests below.
func signedSamples(t testing.TB) (keys verify.KeySet, events [][]byte) {
	key := seededKey(1)
	keys = verify.KeySet{}
	keys.Add(key.Public())
	c := receipts.NewChain("w1", key)
	for i := 1; i <= 3; i++ {
		r := receipttest.Receipt(i, i)
		if i == 2 {
			r.Effect = &schemas.ToolEffect{EffectID: "e\u00e9", DocumentHashes: []schemas.DocumentHash{}, BatchTotalBytes: 7}
			r.CapabilityIDs = []string{"a", "b\n\"c\""}
			r.Control = &schemas.ControlRecord{Verb: "kill", Accepted: true, Seq: 9,
				Command: &schemas.ControlCommand{CommandID: "x", Verb: "kill", Signature: &schemas.Signature{Alg: "Ed25519", KID: "k", Sig: "s"},
					Manifests: []json.RawMessage{json.RawMessage(`{"b":[1,2.5],"a":"x"}`), json.RawMessage(`null`)}}}
		}
		if i == 3 {
			r.AgentID = "agent \x01\x1f\u2028\U0001F600"
			r.ReasonCodes = nil
		}
		s, err := c.Seal(testMeta(i), r)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(s); err != nil {
			t.Fatal(err)
		}
		events = append(events, s.JSON)
	}
	cp, err := c.Checkpoint(receipts.Meta{Source: "talos://enforce/w1", Time: receipttest.Time, ID: "cp-1"}, false)
	if err != nil {
		t.Fatal(err)
	}
	events = append(events, cp.JSON)
	m := testMeta(9)
	m.Type, m.Subject = schemas.TypeToolCall, ""
	tc, err := receipts.SignEvent(key, m, map[string]any{"a": 1.5, "tool_call_id": "t", "z": []any{nil, true}})
	if err != nil {
		t.Fatal(err)
	}
	return keys, append(events, tc.JSON)
}

// checkPathsAgree asserts that verify.VerifyEvent (whichever path it takes) and
// the general path return the same event and the same error for raw, and
// reports whether the fast path handled it.
func checkPathsAgree(t *testing.T, raw []byte, keys verify.KeySet) (fast bool) {
	t.Helper()
	gev, gerr := verify.VerifyEventGeneral(raw, keys)
	ev, chk, ok := verify.ParseSigned(raw, keys)
	if !ok {
		return false
	}
	var err error
	if !verify.Verify(chk.Pub, chk.Message, chk.Sig) {
		err = verify.BadSignature(ev)
	}
	if fmt.Sprint(err) != fmt.Sprint(gerr) {
		t.Fatalf("fast path error %v, general path %v\n%s", err, gerr, raw)
	}
	if gev == nil || !ev.Canonical || gev.Canonical {
		t.Fatalf("fast path event %+v, general %+v", ev, gev)
	}
	cp := *ev
	cp.Canonical = false
	if !reflect.DeepEqual(&cp, gev) {
		t.Fatalf("fast path event differs:\n%+v\n%+v\n%s", &cp, gev, raw)
	}
	return true
}

// TestVerifyEventPathsAgree: the one-pass parser and the general verifier
// (canonicalize, then encoding/json) agree on events as published and on
// every kind of deviation; the deviations that the fast path must not
// take are left to the general path.
func TestVerifyEventPathsAgree(t *testing.T) {
	keys, events := signedSamples(t)
	for i, raw := range events {
		if !checkPathsAgree(t, raw, keys) {
			t.Errorf("event %d as published did not take the fast path:\n%s", i, raw)
		}
	}
	rec := string(events[0])
	repl := func(old, new string) []byte {
		if !strings.Contains(rec, old) {
			t.Fatalf("sample has no %q", old)
		}
		return []byte(strings.Replace(rec, old, new, 1))
	}
	tamperedSig := []byte(rec)
	tamperedSig[strings.Index(rec, `"sig":"`)+len(`"sig":"`)+3] ^= 1
	cases := map[string]struct {
		raw  []byte
		fast bool
	}{
		"tampered field":         {repl(`"tool":"write_file"`, `"tool":"rm_rf"`), true},
		"tampered sig":           {tamperedSig, true},
		"unknown member in data": {repl(`{"data":{`, `{"data":{"aaa_extra":[1,{"a":null}],`), true},
		"case-folded data key":   {repl(`"tool":"write_file"`, `"tool":"write_file","tool_Name":"x"`), false},
		"extension attribute":    {repl(`"type":`, `"typex":"1","type":`), false},
		"upper-case attribute":   {repl(`{"data":`, `{"ID":"other","data":`), false},
		"not canonical":          {repl(`{"data":`, `{ "data":`), false},
		"keys out of order":      {repl(`"datacontenttype":"application/json","id":`, `"id":"x","datacontenttype":"application/json","idx":`), false},
		"subject null":           {repl(`"subject":"`, `"subject":null,"subjectx":"`), false},
		"number where string":    {repl(`"tool":"write_file"`, `"tool":5`), false},
		"float seq":              {repl(`"seq":1`, `"seq":1.5`), false},
		"huge size":              {repl(`"size_bytes":1000`, `"size_bytes":1e+300`), false},
		"negative seq":           {repl(`"seq":1`, `"seq":-1`), false},
		"bad alg":                {repl(`"alg":"Ed25519"`, `"alg":"none"`), false},
		"unknown kid":            {repl(`"kid":"`, `"kid":"0`), false},
		"bad base64":             {repl(`"sig":"`, `"sig":"!`), false},
		"bad time":               {repl(`"time":"2025`, `"time":"x2025`), false},
		"blank id":               {repl(`"id":"0190`, `"id":" 0190`), true},
		"escaped string":         {repl(`"agent_id":"agent-7"`, `"agent_id":"a\"\\\b\f\n\r\t\u0001"`), true},
		"bad escape":             {repl(`"agent_id":"agent-7"`, `"agent_id":"a\u000a"`), false},
		"unicode":                {repl(`"agent_id":"agent-7"`, `"agent_id":"é😀`+"\x7f"+`"`), true},
		"null reason codes":      {repl(`"reason_codes":[]`, `"reason_codes":null`), true},
		"null effect":            {repl(`"envelope_hash":`, `"effect":null,"envelope_hash":`), true},
		"no chain":               {repl(`"chain":{`, `"chaim":{`), false},
		"signature null":         {repl(`"signature":{"alg":"Ed25519"`, `"signature":null,"signaturf":{"alg":"Ed25519"`), false},
		"trailing bytes":         {append(append([]byte(nil), events[0]...), ' '), false},
		"content type":           {repl(`"application/json"`, `"application/json; charset=utf-8"`), true},
		"not a receipt type":     {repl(`"type":"dev.talos.receipt.decision.v1"`, `"type":"dev.talos.other.v1"`), true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if fast := checkPathsAgree(t, c.raw, keys); fast != c.fast {
				t.Errorf("fast path taken: %v, want %v", fast, c.fast)
			}
			// verify.VerifyEvent and verify.VerifyEvents give what the general path gives.
			gev, gerr := verify.VerifyEventGeneral(c.raw, keys)
			ev, err := verify.VerifyEvent(c.raw, keys)
			evs, errs := verify.VerifyEvents([][]byte{events[1], c.raw}, keys)
			if fmt.Sprint(err) != fmt.Sprint(gerr) || fmt.Sprint(errs[1]) != fmt.Sprint(gerr) || errs[0] != nil {
				t.Errorf("errors: verify.VerifyEvent %v, verify.VerifyEvents %v, general %v", err, errs, gerr)
			}
			if (ev == nil) != (gev == nil) || (evs[1] == nil) != (gev == nil) || ev != nil && (ev.Hash != gev.Hash || evs[1].Hash != gev.Hash) {
				t.Errorf("events: %+v / %+v / %+v", ev, evs[1], gev)
			}
		})
	}
}

// FuzzVerifyEventPaths: on arbitrary bytes (seeded with signed events),
// the fast path, when it runs, agrees with the general path exactly.
func FuzzVerifyEventPaths(f *testing.F) {
	keys, events := signedSamples(f)
	for _, e := range events {
		f.Add(e)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkPathsAgree(t, raw, keys)
	})
}

// FuzzDecodeCanonical: where the one-pass decoder reads a canonical
// document into a receipt, encoding/json reads the same.
func FuzzDecodeCanonical(f *testing.F) {
	_, events := signedSamples(f)
	for _, e := range events {
		f.Add(e)
	}
	f.Add([]byte(`{"data":{"Tool":"x","tool":"y"}}`))
	f.Add([]byte(`{"data":{"chain":{"seq":18446744073709551615},"batch_total_bytes":-9223372036854775808}}`))
	f.Add([]byte(`{"data":{"document_hashes":[{"pointer":"a"},null,{}],"effect":{},"signature":null}}`))
	f.Add([]byte(`{"data":{"control":{"command":{"manifests":[{"a":1},null,"x",[]]}}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		canon, err := jcs.Transform(b)
		if err != nil || !jsonkit.IsCanonicalObject(canon) {
			return
		}
		var fast struct {
			Data schemas.Receipt `json:"data"`
		}
		if !verify.DecodeCanonical(canon, string(canon), 0, len(canon), &fast) {
			return
		}
		var slow struct {
			Data schemas.Receipt `json:"data"`
		}
		if err := json.Unmarshal(canon, &slow); err != nil {
			t.Fatalf("decoded fast, but encoding/json fails: %v\n%s", err, canon)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("decoders differ on %s:\nfast %+v\nslow %+v", canon, fast, slow)
		}
		// Reading without the string form (every string a copy) reads the same.
		var copied struct {
			Data schemas.Receipt `json:"data"`
		}
		if !verify.DecodeCanonical(canon, "", 0, len(canon), &copied) || !reflect.DeepEqual(copied, slow) {
			t.Fatalf("decoding with copies differs on %s:\n%+v\n%+v", canon, copied, slow)
		}
	})
}

// TestSortKeyReadsLikeEncodingJSON: verify.SortForVerify's one-pass read of an
// event's id and chain position gives what encoding/json gives, for events
// as published and variants it must leave to encoding/json.
func TestSortKeyReadsLikeEncodingJSON(t *testing.T) {
	_, events := signedSamples(t)
	raws := append([][]byte(nil), events...)
	rec := string(events[0])
	for _, edit := range [][2]string{
		{`"chain":{`, `"CHAIN":{"seq":99},"chain":{`},
		{`"chain":{`, `"chaiN":{"seq":99},"chain":{`},
		{`"seq":1`, `"seq":1.0`},
		{`"seq":1`, `"seq":"1"`},
		{`{"data":`, `{"ID":"x","data":`},
		{`"id":"`, `"id":"\u0001`},
		{`{"data":`, ` {"data":`},
		{`"chain_id":"w1"`, `"chain_id":null`},
	} {
		if !strings.Contains(rec, edit[0]) {
			t.Fatalf("no %q", edit[0])
		}
		raws = append(raws, []byte(strings.Replace(rec, edit[0], edit[1], 1)))
	}
	for i, raw := range raws {
		got, ok := verify.SortKeyOf(raw)
		var want verify.SortKey
		wantOK := json.Unmarshal(raw, &want) == nil
		if ok != wantOK || ok && got != want {
			t.Errorf("event %d: %+v %v, encoding/json %+v %v\n%s", i, got, ok, want, wantOK, raw)
		}
	}
}

// TestVerifyEventsMatchesVerifyEvent: batches give per-event results
// identical to one-at-a-time verification, bad and foreign ones included.
func TestVerifyEventsMatchesVerifyEvent(t *testing.T) {
	keys, events := signedSamples(t)
	bad := bytes.Clone(events[0])
	bad[bytes.Index(bad, []byte(`"sig":"`))+9] ^= 1
	other := verify.KeySet{}
	other.Add(seededKey(7).Public())
	batch := append([][]byte{bad, []byte(`{}`), []byte(`not json`)}, events...)
	for _, ks := range []verify.KeySet{keys, other} {
		evs, errs := verify.VerifyEvents(batch, ks)
		for i, raw := range batch {
			ev, err := verify.VerifyEvent(raw, ks)
			if fmt.Sprint(err) != fmt.Sprint(errs[i]) || !reflect.DeepEqual(ev, evs[i]) {
				t.Errorf("event %d: verify.VerifyEvents %v %v, verify.VerifyEvent %v %v", i, evs[i], errs[i], ev, err)
			}
		}
	}
	if _, errs := verify.VerifyEvents(batch, keys); !errors.Is(errs[0], verify.ErrBadSignature) || errs[3] != nil {
		t.Errorf("errors %v", errs)
	}
}

// FuzzVerifyEventValues: receipts with arbitrary strings in their fields
// (written canonically, then re-signed or not), with one byte possibly
// changed, read the same by both paths.
func FuzzVerifyEventValues(f *testing.F) {
	f.Add("agent-7", "write_file", 0, byte(0), true)
	f.Add("a\"\\\x01\u2028😀\xff", "é", 17, byte('"'), false)
	f.Add("", "\x7f", 400, byte('\\'), true)
	key := seededKey(1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	f.Fuzz(func(t *testing.T, agent, tool string, pos int, b byte, resign bool) {
		r := receipttest.Receipt(1, 1)
		r.AgentID, r.Tool, r.ReasonCodes = agent, tool, []string{tool, agent}
		s, err := receipts.NewChain("w1", key).Seal(testMeta(1), r)
		if err != nil {
			t.Fatal(err)
		}
		raw := s.JSON
		if !resign {
			// Same bytes but the agent, unsigned: a bad signature.
			raw = []byte(strings.Replace(string(raw), string(jsonkit.AppendString(nil, agent)), `"x"`, 1))
		}
		if pos > 0 {
			raw[pos%len(raw)] = b
		}
		checkPathsAgree(t, raw, keys)
	})
}
