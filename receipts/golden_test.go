package receipts

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/sealed from the current code")

// goldenCase produces one signed output from fixed inputs (key, time, id).
type goldenCase struct {
	name string
	run  func(t *testing.T) string // the golden text, or "error" if signing must fail
}

// sealedText is the golden form of a Sealed: its fields, then its exact
// JSON on a line of its own.
func sealedText(s *Sealed) string {
	return fmt.Sprintf("id=%s seq=%d chain_id=%s prev_hash=%s kid=%s hash=%s\n%s\n",
		s.ID, s.Seq, s.ChainID, s.PrevHash, s.KID, s.Hash, s.JSON)
}

func goldenCases() []goldenCase {
	oddReceipt := func() *schemas.Receipt {
		r := receipttest.Receipt(7, 2)
		r.EventType, r.Phase = schemas.KindEffect, schemas.PhasePost
		r.AgentID = "agent \"7\"\n\t\u00e9\u2028\U0001F600\x01\x7f"
		r.Tool = "write<&>file"
		r.SessionID = "bad utf8 \xff\xfe end"
		r.ReasonCodes = []string{"A", "B"}
		r.CapabilityIDs = []string{"cap-root", "cap-leaf"}
		r.IdempotentOf = &schemas.IdempotentOf{ToolCallID: "tc-1"}
		r.ControlSeq = 42
		r.Effect = &schemas.ToolEffect{EffectID: "0190f5d3-0000-7000-8000-000000000009", ToolCallID: r.ToolCallID,
			DocumentHashes: []schemas.DocumentHash{}, BatchTotalBytes: 1 << 53, ContentHashAlg: "sha256"}
		r.ContentHashAlg = "" // Seal fills it
		return r
	}
	sealAt := func(t *testing.T, c *Chain, meta Meta, r *schemas.Receipt) string {
		s, err := c.Seal(meta, r)
		if err != nil {
			return "error"
		}
		if err := c.Commit(s); err != nil {
			t.Fatal(err)
		}
		return sealedText(s)
	}
	sign := func(meta Meta, v any) string {
		s, err := SignEvent(seededKey(1), meta, v)
		if err != nil {
			return "error"
		}
		return sealedText(s)
	}
	withMeta := func(f func(*Meta)) Meta {
		m := testMeta(3)
		m.Type = schemas.TypeToolCall
		f(&m)
		return m
	}
	obj := map[string]any{"a": 1.5, "z": []any{true, nil, "x"}}
	return []goldenCase{
		{"decision_chain", func(t *testing.T) string {
			c := NewChain("w1-0", testKey(t, 1))
			out := ""
			for i := 1; i <= 3; i++ {
				out += sealAt(t, c, testMeta(i), receipttest.Receipt(i, 8))
			}
			return out
		}},
		{"effect_odd_strings", func(t *testing.T) string {
			c := NewChain("w2", testKey(t, 2))
			m := testMeta(9)
			m.Type = schemas.TypeReceiptEffect
			m.Time = time.Date(2025, 1, 2, 3, 4, 5, 999999999, time.FixedZone("x", -3*3600-1800))
			return sealAt(t, c, m, oddReceipt())
		}},
		{"checkpoint", func(t *testing.T) string {
			c := NewChain("w3", testKey(t, 3))
			buildLinks(t, c, 1, 5, 1)
			s, err := c.Checkpoint(Meta{Source: "talos://enforce/w3", Time: receipttest.Time, ID: "0190f5d3-0000-7000-8000-0000000000c1"}, false)
			if err != nil {
				t.Fatal(err)
			}
			buildLinks(t, c, 6, 7, 1)
			s2, err := c.Checkpoint(Meta{Source: "talos://enforce/w3", Time: receipttest.Time.Add(time.Second), ID: "0190f5d3-0000-7000-8000-0000000000c2"}, true)
			if err != nil {
				t.Fatal(err)
			}
			return sealedText(s) + sealedText(s2)
		}},
		{"event_signature_first", func(*testing.T) string {
			return sign(withMeta(func(*Meta) {}), map[string]any{"zz": "x", "tt": 1})
		}},
		{"event_signature_last", func(*testing.T) string {
			return sign(withMeta(func(*Meta) {}), obj)
		}},
		{"event_signature_middle", func(*testing.T) string {
			return sign(withMeta(func(*Meta) {}), map[string]any{"a": 1, "\U0001F600": 2, "\uFFFD": 3, "sig": 4, "t": 5})
		}},
		{"event_empty_data", func(*testing.T) string {
			return sign(withMeta(func(*Meta) {}), struct{}{})
		}},
		{"event_no_subject", func(*testing.T) string {
			return sign(withMeta(func(m *Meta) { m.Subject = "" }), obj)
		}},
		{"event_context_trimmed", func(*testing.T) string {
			return sign(withMeta(func(m *Meta) {
				m.ID, m.Type, m.Subject = "  id-1\t", " dev.talos.x.v1\n", "\t s u b \n"
			}), obj)
		}},
		{"event_blank_subject_omitted", func(*testing.T) string {
			return sign(withMeta(func(m *Meta) { m.Subject = " \t\n" }), obj)
		}},
		{"event_context_escapes", func(*testing.T) string {
			return sign(withMeta(func(m *Meta) {
				m.ID, m.Type, m.Subject = "id\"\\\u00e9", "type\u2028\x02", "sub\xffject"
			}), obj)
		}},
		{"event_source_normalized", func(*testing.T) string {
			out := ""
			for _, src := range []string{"talos://enforce/w 1", "TALOS://Enforce/é", " ", "talos://enforce/w1?x=y#f", "urn:x:y",
				"/rel", "talos://enforce/w1 ", "talos://u@h:1/p/../q", "talos://enforce/w%41", "talos://[::1]:80/x", "a:b\"c"} {
				out += src + ": " + sign(withMeta(func(m *Meta) { m.Source = src }), obj)
			}
			return out
		}},
		{"event_time_far", func(*testing.T) string {
			return sign(withMeta(func(m *Meta) { m.Time = time.Date(1969, 12, 31, 23, 59, 59, 999_500_000, time.UTC) }), obj)
		}},
		{"event_rejected_contexts", func(*testing.T) string {
			out := ""
			for _, f := range []func(*Meta){
				func(m *Meta) { m.ID = " \t" },
				func(m *Meta) { m.Type = "" },
				func(m *Meta) { m.Type = " \n" },
				func(m *Meta) { m.Source = "" },
				func(m *Meta) { m.Source = "::bad" },
				func(m *Meta) { m.Source = "talos://bad host/x" },
				func(m *Meta) { m.Source = "talos://enforce/%zz" },
			} {
				out += sign(withMeta(f), obj) + "\n"
			}
			return out
		}},
		{"command", func(t *testing.T) string {
			cmd := &schemas.ControlCommand{SchemaVersion: "talos.control_command.v1", CommandID: "0190f5d3-0000-7000-8000-0000000000d1",
				Verb: "kill_switch.set", Actor: "ops \"1\"", Reason: "é", IssuedAt: "2025-03-01T12:00:00.123Z", Scope: "global"}
			if err := SignCommand(testKey(t, 4), cmd); err != nil {
				t.Fatal(err)
			}
			b, err := jsonkit.MarshalCanonical(cmd)
			if err != nil {
				t.Fatal(err)
			}
			return string(b) + "\n"
		}},
	}
}

// TestSealedGolden pins the exact bytes every signing path produces for
// fixed keys, times and ids (receipts in a chain, checkpoints, events
// outside a chain with odd context values, control commands). Signed
// bytes are a wire contract: a change here breaks every stored hash
// chain. Regenerate with -update only for a deliberate format change.
func TestSealedGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.run(t)
			path := filepath.Join("testdata", "sealed", tc.name+".golden")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("golden file: %v (regenerate with -update only for a deliberate format change)", err)
			}
			if !bytes.Equal([]byte(got), want) {
				t.Errorf("signed bytes changed:\ngot:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
