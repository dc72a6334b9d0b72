package redact

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// loadArgs decodes testdata/args_2k.json (about 2 KB of realistic
// pull-request arguments) the way the worker does, with UseNumber.
func loadArgs(tb testing.TB) (any, []byte) {
	tb.Helper()
	raw, err := os.ReadFile("testdata/args_2k.json")
	if err != nil {
		tb.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		tb.Fatal(err)
	}
	return v, raw
}

// BenchmarkRedact2KB measures Redact on the 2 KB document without secrets
// (the common case) and with four planted secrets.
func BenchmarkRedact2KB(b *testing.B) {
	r := newTestRedactor(b, "bench")
	clean, raw := loadArgs(b)
	dirty, _ := loadArgs(b)
	m := dirty.(map[string]any)
	m["token"] = ghPAT
	m["context"].(map[string]any)["url"] = "https://deploy:" + urlPassword + "@github.com/talos-audit/talos/pull/5"
	m["notes"] = "ran with GITHUB_AUTH=" + wrappedPAT + " and " + jwtToken
	for name, doc := range map[string]any{"clean": clean, "secrets": dirty} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if _, _, err := r.Redact(doc, "/args"); err != nil {
					b.Fatal(err)
				}
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

func TestBenchDocument(t *testing.T) {
	r := newTestRedactor(t, "bench")
	doc, raw := loadArgs(t)
	if len(raw) < 2000 || len(raw) > 2500 {
		t.Fatalf("benchmark document is %d bytes, want about 2 KB", len(raw))
	}
	// The benchmark document holds no secret: nothing may be redacted.
	out, findings, err := r.Redact(doc, "/args")
	if err != nil || len(findings) != 0 {
		t.Fatalf("%v %+v", err, findings)
	}
	if !bytes.Equal(mustMarshal(t, out), mustMarshal(t, doc)) {
		t.Fatal("clean document changed")
	}
}
