package ep_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
)

func TestWriteDecision(t *testing.T) {
	var b bytes.Buffer
	d := &schemas.Decision{Decision: schemas.DecisionDeny, Phase: schemas.PhasePre, ToolCallID: "tc-1", ReceiptID: "r-1",
		RegistryDigest: "sha256:ab", ReasonCodes: []string{"KILL_SWITCH", "REPLAY"}, Details: []string{"scope global"}}
	if err := ep.WriteDecision(&b, d); err != nil {
		t.Fatal(err)
	}
	want := "DENY (phase pre)\n  tool_call_id    tc-1\n  reason codes    KILL_SWITCH, REPLAY\n  receipt         r-1\n" +
		"  registry digest sha256:ab\n  detail          scope global\n"
	if b.String() != want {
		t.Fatalf("got %q\nwant %q", b.String(), want)
	}
	b.Reset()
	if err := ep.WriteDecision(&b, &schemas.Decision{Decision: schemas.DecisionAllow}); err != nil ||
		!bytes.Contains(b.Bytes(), []byte("reason codes    none\n")) {
		t.Fatalf("no reasons: %q %v", b.String(), err)
	}
}

func TestParseExpectedHashes(t *testing.T) {
	got, err := ep.ParseExpectedHashes([]string{"/content=abc", "/a=b=c"})
	want := []schemas.ExpectedHash{{Pointer: "/content", Hash: "abc"}, {Pointer: "/a", Hash: "b=c"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseExpectedHashes = %v, %v", got, err)
	}
	if _, err := ep.ParseExpectedHashes([]string{"/content"}); err == nil || err.Error() != `"/content": want POINTER=SHA256HEX` {
		t.Fatalf("no '=': %v", err)
	}
}
