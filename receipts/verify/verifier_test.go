package verify_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// mutate decodes an event, applies f and re-encodes it (not canonically:
// the verifier must canonicalize).
func mutate(t *testing.T, raw []byte, f func(ev map[string]any)) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	f(ev)
	out, err := json.MarshalIndent(ev, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func data(ev map[string]any) map[string]any { return ev["data"].(map[string]any) }

func idOf(t *testing.T, raw []byte) string {
	var ev struct{ ID string }
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.ID
}

func TestVerifierTamper(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	links := buildChain(t, receipts.NewChain("w1", key), 5) // seq 1..5
	id := func(seq int) string { return idOf(t, links[seq-1]) }

	// A link 3 signed by an untrusted key, in the right place.
	foreign, err := receipts.ResumeChain("w1", testKey(t, 9), 2, mustHash(t, links[1], keys))
	if err != nil {
		t.Fatal(err)
	}
	foreign3, err := foreign.Seal(testMeta(3), receipttest.Receipt(3, 2))
	if err != nil {
		t.Fatal(err)
	}
	// A fork: a different, validly signed history of the same chain.
	fork := receipts.NewChain("w1", key)
	var forkLinks [][]byte
	for i := 31; i <= 33; i++ {
		s, err := fork.Seal(testMeta(i), receipttest.Receipt(i, 2))
		if err != nil {
			t.Fatal(err)
		}
		fork.Commit(s)
		forkLinks = append(forkLinks, s.JSON)
	}
	// Wrong genesis: seq 1 whose prev_hash is not 64 zeros.
	bgr := receipttest.Receipt(1, 2)
	bgr.Chain = schemas.Chain{ChainID: "w1", Seq: 1, PrevHash: receipttest.Hash("not genesis")}
	bg, err := receipts.SignEvent(key, testMeta(1), bgr)
	if err != nil {
		t.Fatal(err)
	}
	// Link 3 of a different chain id spliced in.
	otherChain := buildChain(t, receipts.NewChain("w2", key), 3)

	replace := func(seq int, raw []byte) [][]byte {
		out := append([][]byte(nil), links...)
		out[seq-1] = raw
		return out
	}
	type want struct {
		kind string
		id   string
		seq  uint64
		in   []string // substrings of the detail
	}
	cases := []struct {
		name  string
		input [][]byte
		want  []want
	}{
		{"untouched", links, nil},
		{"flip data field", replace(3, mutate(t, links[2], func(ev map[string]any) { data(ev)["decision"] = "deny" })),
			[]want{{verify.ProblemBadSignature, id(3), 3, []string{"does not match"}}}},
		{"flip nested field", replace(3, mutate(t, links[2], func(ev map[string]any) {
			data(ev)["document_hashes"].([]any)[0].(map[string]any)["size_bytes"] = 1
		})), []want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"add a field", replace(3, mutate(t, links[2], func(ev map[string]any) { data(ev)["note"] = "x" })),
			[]want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"change id", replace(3, mutate(t, links[2], func(ev map[string]any) { ev["id"] = "forged-id" })),
			[]want{{verify.ProblemBadSignature, "forged-id", 3, nil}}},
		{"change time", replace(3, mutate(t, links[2], func(ev map[string]any) { ev["time"] = "2030-01-01T00:00:00.000Z" })),
			[]want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"change subject", replace(3, mutate(t, links[2], func(ev map[string]any) { ev["subject"] = "other-call" })),
			[]want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"change signature", replace(3, mutate(t, links[2], func(ev map[string]any) {
			sig := data(ev)["signature"].(map[string]any)
			s := []byte(sig["sig"].(string))
			s[10] ^= 1
			sig["sig"] = string(s)
		})), []want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"transplant signature of link 2", replace(3, mutate(t, links[2], func(ev map[string]any) {
			var l2 map[string]any
			json.Unmarshal(links[1], &l2)
			data(ev)["signature"] = data(l2)["signature"]
		})), []want{{verify.ProblemBadSignature, id(3), 3, nil}}},
		{"unknown key", replace(3, foreign3.JSON), []want{{verify.ProblemUnknownKey, idOf(t, foreign3.JSON), 3, []string{foreign3.KID}}}},
		{"forged link before the real one", [][]byte{links[0], links[1], foreign3.JSON, links[2], links[3], links[4]},
			[]want{{verify.ProblemUnknownKey, idOf(t, foreign3.JSON), 3, nil}}},
		{"forged link before a link of another history", [][]byte{links[0], links[1], foreign3.JSON, forkLinks[2]},
			[]want{{verify.ProblemUnknownKey, idOf(t, foreign3.JSON), 3, nil}, {verify.ProblemPrevHashMismatch, idOf(t, forkLinks[2]), 3, nil}}},
		{"delete middle link", append(append([][]byte(nil), links[:2]...), links[3:]...),
			[]want{{verify.ProblemChainGap, id(4), 4, []string{"seq 3 missing", id(2), id(4)}}}},
		{"delete two links", [][]byte{links[0], links[3], links[4]},
			[]want{{verify.ProblemChainGap, id(4), 4, []string{"seq 2..3 missing", id(1)}}}},
		{"swap two links", [][]byte{links[0], links[1], links[3], links[2], links[4]},
			[]want{{verify.ProblemChainGap, id(4), 4, []string{"seq 3 missing"}}, {verify.ProblemOutOfOrder, id(3), 3, []string{id(4)}}}},
		{"duplicate link", [][]byte{links[0], links[1], links[2], links[2], links[3], links[4]},
			[]want{{verify.ProblemDuplicateSeq, id(3), 3, []string{"same content"}}}},
		{"fork at seq 3", [][]byte{links[0], links[1], links[2], forkLinks[2], links[3], links[4]},
			[]want{{verify.ProblemDuplicateSeq, idOf(t, forkLinks[2]), 3, []string{"fork", id(3)}}}},
		{"link from another history", [][]byte{links[0], links[1], forkLinks[2]},
			[]want{{verify.ProblemPrevHashMismatch, idOf(t, forkLinks[2]), 3, []string{id(2)}}}},
		{"wrong genesis", replace(1, bg.JSON),
			[]want{{verify.ProblemPrevHashMismatch, bg.ID, 1, []string{"genesis"}}, {verify.ProblemPrevHashMismatch, id(2), 2, []string{bg.ID}}}},
		{"missing first link", links[1:], []want{{verify.ProblemChainGap, id(2), 2, []string{"seq 1 missing"}}}},
		{"other chain spliced", replace(3, otherChain[2]),
			[]want{{verify.ProblemChainGap, idOf(t, otherChain[2]), 3, []string{"chain w2", "seq 1..2 missing"}}, {verify.ProblemChainGap, id(4), 4, []string{"seq 3 missing"}}}},
		{"garbage", replace(3, []byte("not json")),
			[]want{{verify.ProblemMalformed, "", 0, []string{"unreadable id"}}, {verify.ProblemChainGap, id(4), 4, []string{"seq 3 missing"}}}},
		{"unsigned", replace(3, mutate(t, links[2], func(ev map[string]any) { delete(data(ev), "signature") })),
			[]want{{verify.ProblemMalformed, id(3), 3, []string{"unsigned"}}}},
		{"duplicate key", replace(3, []byte(strings.Replace(string(links[2]), `{"data":{`, `{"data":{"decision":"allow",`, 1))),
			[]want{{verify.ProblemMalformed, id(3), 3, []string{"Duplicate key"}}}},
		{"wrong specversion", replace(3, mutate(t, links[2], func(ev map[string]any) { ev["specversion"] = "0.3" })),
			[]want{{verify.ProblemMalformed, id(3), 3, []string{"specversion"}}}},
		{"no chain", replace(3, mutate(t, links[2], func(ev map[string]any) { delete(data(ev), "chain") })),
			[]want{{verify.ProblemMalformed, id(3), 0, []string{"chain"}}, {verify.ProblemChainGap, id(4), 4, []string{"seq 3 missing"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := verify.NewVerifier(keys)
			var fromAdd []verify.Problem
			for _, raw := range tc.input {
				_, ps := v.Add(raw)
				fromAdd = append(fromAdd, ps...)
			}
			r := v.Finish()
			if r.Checked != len(tc.input) {
				t.Errorf("checked %d, want %d", r.Checked, len(tc.input))
			}
			if r.OK() != (len(tc.want) == 0) {
				t.Errorf("OK() = %v with problems %v", r.OK(), r.Problems)
			}
			if len(r.Problems) != len(tc.want) || len(fromAdd) != len(r.Problems) {
				t.Fatalf("got %d problems (Add returned %d), want %d:\n%s", len(r.Problems), len(fromAdd), len(tc.want), problemList(r.Problems))
			}
			for i, w := range tc.want {
				p := r.Problems[i]
				if p.Kind != w.kind || p.ReceiptID != w.id || p.Seq != w.seq {
					t.Errorf("problem %d = %s\nwant kind %s receipt %q seq %d", i, p, w.kind, w.id, w.seq)
				}
				if w.id != "" && !strings.Contains(p.String(), w.id) {
					t.Errorf("String() does not name the receipt: %s", p)
				}
				for _, s := range w.in {
					if !strings.Contains(p.String(), s) {
						t.Errorf("problem %s does not mention %q", p, s)
					}
				}
			}
		})
	}
}

func mustHash(t *testing.T, raw []byte, keys verify.KeySet) string {
	t.Helper()
	ev, err := verify.VerifyEvent(raw, keys)
	if err != nil {
		t.Fatal(err)
	}
	return ev.Hash
}

func problemList(ps []verify.Problem) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintln(&b, " ", p)
	}
	return b.String()
}

// test_signature_context_confusion: a signature made for one event cannot
// verify another — not another type, not the same data in another
// envelope, not the data alone.
func TestSignatureContextConfusion(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	c := receipts.NewChain("w1", key)
	r := receipttest.Receipt(1, 2)
	dec, err := c.Seal(testMeta(1), r)
	if err != nil {
		t.Fatal(err)
	}
	// Same event, type relabelled: decision → control / effect / toolcall.
	for _, typ := range []string{schemas.TypeReceiptControl, schemas.TypeReceiptEffect, schemas.TypeToolCall, schemas.TypeCheckpoint} {
		forged := mutate(t, dec.JSON, func(ev map[string]any) { ev["type"] = typ })
		if _, err := verify.VerifyEvent(forged, keys); !errors.Is(err, verify.ErrBadSignature) {
			t.Errorf("decision signature accepted as %s: %v", typ, err)
		}
	}
	// An honest control event over the very same data: its signature does
	// not transfer to the decision event, nor the other way round.
	m := testMeta(1)
	m.Type = schemas.TypeReceiptControl
	r2 := receipttest.Receipt(1, 2)
	ctl, err := receipts.NewChain("w1", key).Seal(m, r2)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Hash == ctl.Hash {
		t.Fatal("different types hash alike")
	}
	swap := func(dst, src []byte) []byte {
		var s map[string]any
		json.Unmarshal(src, &s)
		return mutate(t, dst, func(ev map[string]any) { data(ev)["signature"] = data(s)["signature"] })
	}
	if _, err := verify.VerifyEvent(swap(dec.JSON, ctl.JSON), keys); !errors.Is(err, verify.ErrBadSignature) {
		t.Errorf("control signature verified a decision: %v", err)
	}
	if _, err := verify.VerifyEvent(swap(ctl.JSON, dec.JSON), keys); !errors.Is(err, verify.ErrBadSignature) {
		t.Errorf("decision signature verified a control receipt: %v", err)
	}
	// A signature over JCS(data) alone (not the event) does not verify.
	r.Signature = nil
	dataOnly, _ := jsonkit.MarshalCanonical(r)
	other, err := receipts.SignEvent(key, receipts.Meta{Type: schemas.TypeCheckpoint, Source: "talos://x/y", ID: "i", Time: receipttest.Time}, json.RawMessage(dataOnly))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify.VerifyEvent(swap(dec.JSON, other.JSON), keys); !errors.Is(err, verify.ErrBadSignature) {
		t.Errorf("signature over other bytes verified: %v", err)
	}
}

func TestVerifyEventErrors(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	s, err := receipts.NewChain("w1", key).Seal(testMeta(1), receipttest.Receipt(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify.VerifyEvent(s.JSON, verify.KeySet{}); !errors.Is(err, verify.ErrUnknownKey) {
		t.Errorf("empty key set: %v", err)
	}
	ev, err := verify.VerifyEvent(mutate(t, s.JSON, func(ev map[string]any) { data(ev)["tool"] = "rm" }), keys)
	if !errors.Is(err, verify.ErrBadSignature) || ev == nil || ev.ID != s.ID {
		t.Errorf("tampered: %v %v", ev, err)
	}
	var ve *verify.VerifyError
	if !errors.As(err, &ve) || ve.Kind != verify.ProblemBadSignature {
		t.Errorf("not a *VerifyError: %T", err)
	}
	for name, raw := range map[string]string{
		"array":        `[1]`,
		"no data":      `{"id":"x"}`,
		"data string":  `{"data":"x"}`,
		"bad alg":      strings.Replace(string(s.JSON), `"alg":"Ed25519"`, `"alg":"none"`, 1),
		"bad time":     strings.Replace(string(s.JSON), `"time":"2025`, `"time":"yesterday 2025`, 1),
		"content type": strings.Replace(string(s.JSON), `"application/json"`, `"text/plain"`, 1),
	} {
		if _, err := verify.VerifyEvent([]byte(raw), keys); !errors.Is(err, verify.ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
}

func TestVerifierInterleavedAndSorted(t *testing.T) {
	key1, key2 := testKey(t, 1), testKey(t, 2)
	keys := verify.KeySet{}
	keys.Add(key1.Public())
	keys.Add(key2.Public())
	a := buildChain(t, receipts.NewChain("a", key1), 20)
	b := buildChain(t, receipts.NewChain("b", key2), 15)
	var all [][]byte
	for i := range 20 { // interleaved, each chain in order
		all = append(all, a[i])
		if i < len(b) {
			all = append(all, b[i])
		}
	}
	v := verify.NewVerifier(keys)
	for _, raw := range all {
		if _, ps := v.Add(raw); len(ps) != 0 {
			t.Fatalf("problems: %v", ps)
		}
	}
	r := v.Finish()
	want := map[string]verify.ChainSummary{"a": {First: 1, Last: 20, Count: 20}, "b": {First: 1, Last: 15, Count: 15}}
	if !r.OK() || r.Checked != 35 || len(r.Chains) != 2 || r.Chains["a"] != want["a"] || r.Chains["b"] != want["b"] {
		t.Errorf("report %+v", r)
	}
	if verify.ChainStates(v) != 2 {
		t.Errorf("verifier holds %d chain states for 2 chains", verify.ChainStates(v))
	}

	// Arbitrary order, plus one unreadable event: sorting restores chain order.
	shuffled := append([][]byte{[]byte("junk")}, all...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	v = verify.NewVerifier(keys)
	for _, raw := range shuffled {
		v.Add(raw)
	}
	if v.Finish().OK() {
		t.Fatal("shuffled input verified without sorting")
	}
	verify.SortForVerify(shuffled)
	if string(shuffled[0]) != "junk" {
		t.Error("unreadable event not sorted first")
	}
	v = verify.NewVerifier(keys)
	for _, raw := range shuffled {
		v.Add(raw)
	}
	r = v.Finish()
	if len(r.Problems) != 1 || r.Problems[0].Kind != verify.ProblemMalformed || r.Chains["a"] != want["a"] || r.Chains["b"] != want["b"] {
		t.Errorf("after sort: %+v", r)
	}
}

func TestVerifierAllowPartial(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	links := buildChain(t, receipts.NewChain("w1", key), 6)
	v := verify.NewVerifier(keys)
	v.AllowPartial = true
	for _, raw := range links[3:] {
		v.Add(raw)
	}
	if r := v.Finish(); !r.OK() || r.Chains["w1"] != (verify.ChainSummary{First: 4, Last: 6, Count: 3}) {
		t.Errorf("partial range: %+v", r)
	}
}
