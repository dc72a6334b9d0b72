package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzRedact feeds arbitrary JSON to Redact: it must not panic, must fail
// only on depth, must leave its input alone, and its output must be JSON
// whose findings point under the base.
func FuzzRedact(f *testing.F) {
	r := newTestRedactor(f, "fuzz")
	for _, p := range plants() {
		f.Add(mustMarshal(f, p.doc))
	}
	f.Add([]byte(`{"a":"` + strings.Repeat("eyJ", 30) + `","b":[["-----BEGIN RSA PRIVATE KEY-----"],"x"]}`))
	f.Add([]byte(`["aGVsbG8gd29ybGQgdG9rZW49Z2hwXzEyMzQ1Njc4OTBhYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5eg=="]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return
		}
		before, err := json.Marshal(v)
		if err != nil {
			return
		}
		out, findings, err := r.Redact(v, "/args")
		if err != nil {
			if !errors.Is(err, ErrTooDeep) {
				t.Fatalf("Redact: %v", err)
			}
			return
		}
		if after, _ := json.Marshal(v); !bytes.Equal(before, after) {
			t.Fatal("input modified")
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatalf("output is not JSON: %v", err)
		}
		for _, fd := range findings {
			if fd.Pointer != "/args" && !strings.HasPrefix(fd.Pointer, "/args/") {
				t.Fatalf("pointer %q", fd.Pointer)
			}
			if !strings.HasPrefix(fd.Pseudonym, "hmac-sha256:"+r.KeyID()+":") || len(macOf(fd.Pseudonym)) != 64 {
				t.Fatalf("pseudonym %q", fd.Pseudonym)
			}
		}
	})
}
