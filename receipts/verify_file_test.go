package receipts

import (
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// verify.ReadEvents takes JSON lines (blank lines skipped) or one JSON array
// with nothing after it.
func TestReadEvents(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"lines", "{\"id\":\"a\"}\n\n  {\"id\":\"b\"}  \n"},
		{"array", " [{\"id\":\"a\"}, {\"id\":\"b\"}]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := verify.ReadEvents(strings.NewReader(tc.in), "f")
			if err != nil || len(evs) != 2 || string(evs[0]) != `{"id":"a"}` || string(evs[1]) != `{"id":"b"}` {
				t.Fatalf("%q: %v %q", tc.in, err, evs)
			}
		})
	}
	for _, in := range []string{"[{", `[{"id":"a"}] {"id":"b"}`, `[{"id":"a"} {"id":"b"}]`} {
		if _, err := verify.ReadEvents(strings.NewReader(in), "f.json"); err == nil || !strings.HasPrefix(err.Error(), "f.json: ") {
			t.Errorf("broken array %q: %v", in, err)
		}
	}
	for _, in := range []string{"", " \n", "[]", " [ ]\n"} {
		if evs, err := verify.ReadEvents(strings.NewReader(in), "f"); err != nil || len(evs) != 0 {
			t.Errorf("%q: %v %q", in, err, evs)
		}
	}
}
