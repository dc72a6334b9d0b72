package ep

import (
	"fmt"
	"io"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

// WriteDecision writes d as `talosctl call` prints it: the decision and
// phase, then the tool_call_id, reason codes, receipt, registry digest and
// one line per detail.
func WriteDecision(w io.Writer, d *schemas.Decision) error {
	reasons := strings.Join(d.ReasonCodes, ", ")
	if reasons == "" {
		reasons = "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (phase %s)\n  tool_call_id    %s\n  reason codes    %s\n  receipt         %s\n  registry digest %s\n",
		strings.ToUpper(d.Decision), d.Phase, d.ToolCallID, reasons, d.ReceiptID, d.RegistryDigest)
	for _, det := range d.Details {
		fmt.Fprintf(&b, "  detail          %s\n", det)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ParseExpectedHashes reads expected_document_hashes entries written
// POINTER=SHA256HEX (talosctl call --expect-hash).
func ParseExpectedHashes(entries []string) ([]schemas.ExpectedHash, error) {
	var out []schemas.ExpectedHash
	for _, e := range entries {
		p, h, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want POINTER=SHA256HEX", e)
		}
		out = append(out, schemas.ExpectedHash{Pointer: p, Hash: h})
	}
	return out, nil
}
