package jsonkit_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

func decodeTree(t testing.TB, b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// CanonicalTree of a parsed document equals the RFC 8785 vectors.
func TestCanonicalTreeVectors(t *testing.T) {
	dir := jcsVectors
	inputs, err := filepath.Glob(filepath.Join(dir, "input", "*.json"))
	if err != nil || len(inputs) < 6 {
		t.Fatalf("RFC 8785 test vectors missing under %s: %d found, %v", dir, len(inputs), err)
	}
	for _, in := range inputs {
		raw, _ := os.ReadFile(in)
		want, err := os.ReadFile(filepath.Join(dir, "output", filepath.Base(in)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := jsonkit.CanonicalTree(decodeTree(t, raw))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if !bytes.Equal(got, bytes.TrimRight(want, "\n")) {
			t.Errorf("%s:\n got %s\nwant %s", filepath.Base(in), got, want)
		}
		// Appended to a buffer in use, the same bytes follow what was there.
		prefix := []byte("kept:")
		app, err := jsonkit.AppendCanonicalTree(append(make([]byte, 0, 8), prefix...), decodeTree(t, raw))
		if err != nil || !bytes.Equal(app, append(prefix, got...)) {
			t.Errorf("%s: AppendCanonicalTree = %s, %v; want %s%s", filepath.Base(in), app, err, prefix, got)
		}
	}
}

func FuzzCanonicalTree(f *testing.F) {
	f.Add([]byte(`{"b":[1,2.50,-0,1e21,"\u00e9"],"a":{"\ud83d\ude00":true,"z":null}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		want, err := jsonkit.Canonicalize(b)
		if err != nil {
			return
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil || d.More() {
			return
		}
		got, err := jsonkit.CanonicalTree(v)
		if err != nil {
			return // e.g. invalid UTF-8 that jcs passes through differently
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("tree %s\n jcs %s", got, want)
		}
	})
}
