package receipts

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

func TestSealVerifyRoundTrip(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	c := NewChain("w1-0", key)
	prev := schemas.GenesisHash
	for i := 1; i <= 3; i++ {
		r := receipttest.Receipt(i, 8)
		r.ContentHashAlg = ""
		s, err := c.Seal(testMeta(i), r)
		if err != nil {
			t.Fatal(err)
		}
		if s.Seq != uint64(i) || s.ChainID != "w1-0" || s.PrevHash != prev || s.KID != key.KID {
			t.Fatalf("sealed %+v", s)
		}
		if r.Chain != (schemas.Chain{ChainID: "w1-0", Seq: uint64(i), PrevHash: prev}) {
			t.Errorf("data.Chain = %+v", r.Chain)
		}
		if r.Signature == nil || r.Signature.KID != key.KID || r.Signature.Alg != "Ed25519" || r.ContentHashAlg != "sha256" {
			t.Errorf("data not filled: sig %+v alg %q", r.Signature, r.ContentHashAlg)
		}
		// Published bytes are canonical, and are the signed bytes plus
		// data.signature: removing it gives bytes whose sha256 is the hash.
		if canon, err := jsonkit.Canonicalize(s.JSON); err != nil || !bytes.Equal(canon, s.JSON) {
			t.Errorf("published JSON is not canonical: %v", err)
		}
		dm, _, _, _ := jsonkit.FindMember(s.JSON, 0, "data")
		sm, found, _, _ := jsonkit.FindMember(s.JSON, dm.ValStart, "signature")
		if !found {
			t.Fatal("no data.signature in published JSON")
		}
		sum := sha256.Sum256(jsonkit.RemoveMember(s.JSON, sm))
		if hex.EncodeToString(sum[:]) != s.Hash {
			t.Error("hash is not sha256 of the published bytes minus data.signature")
		}
		// The whole data equals the canonical encoding of the filled receipt.
		want, _ := jsonkit.MarshalCanonical(r)
		if !bytes.Equal(s.JSON[dm.ValStart:dm.End], want) {
			t.Errorf("published data differs from the filled receipt:\n%s\n%s", s.JSON[dm.ValStart:dm.End], want)
		}

		ev, err := verify.VerifyEvent(s.JSON, keys)
		if err != nil {
			t.Fatalf("verify after sign: %v", err)
		}
		m := testMeta(i)
		if ev.ID != m.ID || ev.Hash != s.Hash || ev.Type != m.Type || ev.Subject != m.Subject ||
			ev.Source != m.Source || ev.KID != key.KID || ev.Data.ToolCallID != r.ToolCallID || ev.Data.Chain != r.Chain {
			t.Errorf("event %+v", ev)
		}
		if ev.Time != m.Time.UTC().Format("2006-01-02T15:04:05.000Z") {
			t.Errorf("time %q", ev.Time)
		}

		// The CloudEvents SDK reads and validates it.
		var ce event.Event
		if err := json.Unmarshal(s.JSON, &ce); err != nil {
			t.Fatalf("SDK unmarshal: %v", err)
		}
		if err := ce.Validate(); err != nil || ce.ID() != m.ID || ce.DataContentType() != "application/json" || ce.SpecVersion() != "1.0" {
			t.Errorf("SDK view: %v %s", err, ce)
		}
		if err := c.Commit(s); err != nil {
			t.Fatal(err)
		}
		if seq, h := c.Head(); seq != uint64(i) || h != s.Hash {
			t.Errorf("head %d %s", seq, h)
		}
		prev = s.Hash
	}
}

func TestSealTimeFormat(t *testing.T) {
	c := NewChain("w1", testKey(t, 1))
	m := testMeta(1)
	m.Time = time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	s, err := c.Seal(m, receipttest.Receipt(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(s.JSON, []byte(`"time":"2025-01-02T02:04:05.000Z"`)) {
		t.Errorf("time not RFC 3339 ms UTC: %s", s.JSON)
	}
	// Defaults: a UUIDv7 id and the current time.
	m.ID, m.Time = "", time.Time{}
	s, err = c.Seal(m, receipttest.Receipt(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ID) != 36 || s.ID[14] != '7' {
		t.Errorf("id %q is not a UUIDv7", s.ID)
	}
}

// A dropped publish (duplicate of another worker's receipt) is not
// committed, and the next Seal reuses the seq: no gap.
func TestSealDoesNotAdvance(t *testing.T) {
	key := testKey(t, 1)
	c := NewChain("w1", key)
	a, err := c.Seal(testMeta(1), receipttest.Receipt(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Seal(testMeta(2), receipttest.Receipt(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	if a.Seq != 1 || b.Seq != 1 || b.PrevHash != schemas.GenesisHash {
		t.Fatalf("seqs %d %d", a.Seq, b.Seq)
	}
	if seq, h := c.Head(); seq != 0 || h != schemas.GenesisHash {
		t.Fatalf("head moved before commit: %d %s", seq, h)
	}
	if err := c.Commit(b); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(a); !errors.Is(err, ErrNotNextLink) {
		t.Fatalf("commit of stale seal: %v", err)
	}
	if err := c.Commit(b); !errors.Is(err, ErrNotNextLink) {
		t.Fatalf("double commit: %v", err)
	}
	other := NewChain("w2", key)
	s, _ := other.Seal(testMeta(3), receipttest.Receipt(3, 1))
	if err := c.Commit(s); !errors.Is(err, ErrNotNextLink) {
		t.Fatalf("commit of other chain's link: %v", err)
	}
	next, err := c.Seal(testMeta(3), receipttest.Receipt(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	if next.Seq != 2 || next.PrevHash != b.Hash {
		t.Errorf("next link %d on %s", next.Seq, next.PrevHash)
	}
	if err := c.Commit(next); err != nil {
		t.Fatal(err)
	}
	keys := verify.KeySet{}
	keys.Add(key.Public())
	v := verify.NewVerifier(keys)
	v.Add(b.JSON)
	v.Add(next.JSON)
	if r := v.Finish(); !r.OK() {
		t.Errorf("problems: %v", r.Problems)
	}
}

func TestResumeChain(t *testing.T) {
	key := testKey(t, 1)
	c := NewChain("w1", key)
	links := buildChain(t, c, 2)
	seq, h := c.Head()
	r, err := ResumeChain("w1", key, seq, h)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Seal(testMeta(3), receipttest.Receipt(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	keys := verify.KeySet{}
	keys.Add(key.Public())
	v := verify.NewVerifier(keys)
	for _, l := range append(links, s.JSON) {
		v.Add(l)
	}
	if rep := v.Finish(); !rep.OK() || rep.Chains["w1"].Last != 3 {
		t.Errorf("report %+v", rep)
	}
	for _, bad := range []struct {
		seq  uint64
		hash string
	}{{0, h}, {1, "abc"}, {1, strings.ToUpper(h)}} {
		if _, err := ResumeChain("w1", key, bad.seq, bad.hash); err == nil {
			t.Errorf("ResumeChain(%d, %q) accepted", bad.seq, bad.hash)
		}
	}
}

func TestSealRejects(t *testing.T) {
	key := testKey(t, 1)
	cases := map[string]struct {
		c    *Chain
		meta func(*Meta)
	}{
		"bad chain id": {NewChain("W 1", key), nil},
		"no key":       {NewChain("w1", nil), nil},
		"not receipt":  {NewChain("w1", key), func(m *Meta) { m.Type = schemas.TypeToolCall }},
		"no source":    {NewChain("w1", key), func(m *Meta) { m.Source = "" }},
		"bad source":   {NewChain("w1", key), func(m *Meta) { m.Source = "::bad" }},
		"unsafe int":   {NewChain("w1", key), nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := testMeta(1)
			if tc.meta != nil {
				tc.meta(&m)
			}
			r := receipttest.Receipt(1, 1)
			if name == "unsafe int" {
				r.BatchTotalBytes = 1<<53 + 1
			}
			if s, err := tc.c.Seal(m, r); err == nil {
				t.Errorf("sealed %s", s.JSON)
			}
		})
	}
	if _, err := NewChain("w1", key).Seal(testMeta(1), nil); err == nil {
		t.Error("nil receipt sealed")
	}
}

func TestSignEvent(t *testing.T) {
	key := testKey(t, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	m := testMeta(1)
	m.Type, m.Subject = schemas.TypeCheckpoint, ""
	for name, data := range map[string]any{
		"struct":       struct{ Root string }{"r"},
		"map last key": map[string]any{"a": 1, "z": "last"},
		"empty":        map[string]any{},
		"only after":   map[string]string{"zz": "x"},
	} {
		s, err := SignEvent(key, m, data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Seq != 0 || s.ChainID != "" {
			t.Errorf("%s: chained %+v", name, s)
		}
		if bytes.Contains(s.JSON, []byte(`"subject"`)) {
			t.Errorf("%s: empty subject written", name)
		}
		if _, err := verify.VerifyEvent(s.JSON, keys); err != nil {
			t.Errorf("%s: %v\n%s", name, err, s.JSON)
		}
	}
	for name, data := range map[string]any{
		"has signature": map[string]any{"signature": "x"},
		"not object":    []int{1},
		"string":        "x",
		"null":          nil,
	} {
		if s, err := SignEvent(key, m, data); err == nil {
			t.Errorf("%s: signed %s", name, s.JSON)
		}
	}
}

// Two goroutines racing on one chain: each seals, and commits only if its
// link is still the next one (as a publish dropped as duplicate would not
// be committed). The committed links form a chain without gaps.
func TestChainConcurrentSealCommit(t *testing.T) {
	key := testKey(t, 1)
	c := NewChain("w1", key)
	var mu sync.Mutex
	var stored [][]byte
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := range 30 {
				s, err := c.Seal(testMeta(g*1000+i), receipttest.Receipt(i, 1))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock() // the "stream": store then commit, atomically
				if err := c.Commit(s); err == nil {
					stored = append(stored, s.JSON)
				} else if !errors.Is(err, ErrNotNextLink) {
					t.Error(err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	keys := verify.KeySet{}
	keys.Add(key.Public())
	v := verify.NewVerifier(keys)
	for _, raw := range stored {
		v.Add(raw)
	}
	r := v.Finish()
	if seq, _ := c.Head(); !r.OK() || r.Chains["w1"].Last != seq || int(seq) != len(stored) || seq < 30 {
		t.Errorf("head %d, stored %d, report %+v", seq, len(stored), r)
	}
}
