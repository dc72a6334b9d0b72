package ep

import (
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// BenchmarkReceiptRequestHash is the check an enforcement point makes on
// every decision: the request_hash of its receipt (a signed CloudEvent of
// typical size), found in one walk (what the client does) and level by
// level with FindMember (what it did before: the data member's value is
// walked twice).
func BenchmarkReceiptRequestHash(b *testing.B) {
	hex := strings.Repeat("0123456789abcdef", 4)
	receipt := []byte(`{"data":{"agent_id":"agent-1","capability":{"chain_hash":"` + hex + `","ids":["cap-1","cap-2"]},` +
		`"chain":{"chain_id":"w1-3","prev_hash":"` + hex + `","seq":42},"control_seq":7,` +
		`"decision":"allow","envelope_hash":"` + hex + `","ep_id":"gw-1","phase":"pre","reason_codes":[],` +
		`"registry_digest":"sha256:` + hex + `","request_hash":"` + hex + `","server_id":"files","session_id":"s-1",` +
		`"signature":{"alg":"Ed25519","kid":"0123456789abcdef","sig":"` + strings.Repeat("A", 86) + `"},` +
		`"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","tool_name":"read_file"},` +
		`"datacontenttype":"application/json","id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f","source":"talos://enforce/w1",` +
		`"specversion":"1.0","subject":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","time":"2025-01-02T03:04:05.678Z","type":"talos.receipt.decision"}`)
	if h, ok := receiptRequestHash(receipt); !ok || h != hex {
		b.Fatalf("request hash %q %v", h, ok)
	}
	b.Run("one walk", func(b *testing.B) {
		b.SetBytes(int64(len(receipt)))
		for b.Loop() {
			receiptRequestHash(receipt)
		}
	})
	b.Run("level by level", func(b *testing.B) {
		b.SetBytes(int64(len(receipt)))
		for b.Loop() {
			data, found, _, err := jsonkit.FindMember(receipt, 0, "data")
			if err != nil || !found {
				b.Fatal(err)
			}
			m, found, _, err := jsonkit.FindMember(receipt, data.ValStart, "request_hash")
			if err != nil || !found {
				b.Fatal(err)
			}
			v := receipt[m.ValStart:m.End]
			if end, _, ok := jsonkit.ScanString(v, 0); ok && end == len(v) {
				_ = jsonkit.Unescape(v[1 : end-1])
			}
		}
	})
}
