package verify_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// ReadEventsFile reads a file of JSON lines or of one JSON array.
func TestReadEventsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, []byte("{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := verify.ReadEventsFile(path)
	if err != nil || len(evs) != 2 || string(evs[1]) != `{"id":"b"}` {
		t.Fatalf("lines: %q %v", evs, err)
	}
	array := filepath.Join(t.TempDir(), "events.json")
	if err := os.WriteFile(array, []byte(` [{"id":"c"}]`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err = verify.ReadEventsFile(array)
	if err != nil || len(evs) != 1 || string(evs[0]) != `{"id":"c"}` {
		t.Fatalf("array: %q %v", evs, err)
	}
	if _, err := verify.ReadEventsFile(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing file: no error")
	}
}

// ScanEventsAt says where each event is: the input's bytes there are the
// event's, in every layout ScanEvents reads.
func TestScanEventsAtOffsets(t *testing.T) {
	for name, in := range map[string]string{
		"lines":               "{\"id\":\"a\"}\n{\"id\":\"b\"}\n",
		"white space":         "\n\n  \t{\"id\":\"a\"} \r\n\r\n   {\"id\":\"b\"}\t\n\n{\"id\":\"c\"}",
		"array":               "[{\"id\":\"a\"},{\"id\":\"b\"}]",
		"array, white space":  " \n [\n  {\"id\":\"a\"} ,\n\t{ \"id\" : \"b\" }\n]\n",
		"array of one":        "[ {\"id\":\"a\", \"n\": [1, 2]} ]",
		"lines, long and few": "{\"id\":\"" + strings.Repeat("x", 3<<20) + "\"}\n{\"id\":\"y\"}\n",
	} {
		t.Run(name, func(t *testing.T) {
			want, err := verify.ReadEvents(strings.NewReader(in), name)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]byte
			err = verify.ScanEventsAt(strings.NewReader(in), name, func(raw []byte, off int64) error {
				if off < 0 || off+int64(len(raw)) > int64(len(in)) || in[off:off+int64(len(raw))] != string(raw) {
					t.Errorf("event %d: %q is not at offset %d", len(got), raw, off)
				}
				got = append(got, raw)
				return nil
			})
			if err != nil || len(got) != len(want) || len(got) < 1 {
				t.Fatalf("%d events, %v; ReadEvents read %d", len(got), err, len(want))
			}
			for i := range got {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("event %d: %q, ReadEvents read %q", i, got[i], want[i])
				}
			}
		})
	}
}
