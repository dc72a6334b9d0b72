package query

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// One result in every format: column order kept in JSON, exact values in
// CSV, a person's rendering (dashes, two decimals, a row count) in a table.
func TestWriteResult(t *testing.T) {
	at := time.Date(2026, 6, 1, 12, 0, 0, 250e6, time.FixedZone("x", 3600))
	res := &Result{Name: "x", Columns: []string{"zeta", "day", "when", "tools", "share", "agent"},
		Rows: [][]any{{uint64(3), at, at, []string{"a", "b"}, 0.126, ""}}}
	cases := []struct {
		name, format string
		limit        int
		want         string
	}{
		{"json keeps column order", FormatJSON, 100,
			`[{"zeta":3,"day":"2026-06-01","when":"2026-06-01T11:00:00.250Z","tools":["a","b"],"share":0.126,"agent":""}]` + "\n"},
		{"csv is exact", FormatCSV, 100,
			"zeta,day,when,tools,share,agent\n3,2026-06-01,2026-06-01T11:00:00.250Z,a;b,0.126,\n"},
		{"table for a person", FormatTable, 100,
			"ZETA  DAY         WHEN                      TOOLS  SHARE  AGENT\n3     2026-06-01  2026-06-01T11:00:00.250Z  a,b    0.13   -\n1 row(s)\n"},
		{"table at the limit", "", 1,
			"ZETA  DAY         WHEN                      TOOLS  SHARE  AGENT\n3     2026-06-01  2026-06-01T11:00:00.250Z  a,b    0.13   -\n1 row(s) (the --limit of 1: there may be more)\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteResult(&b, c.format, res, c.limit); err != nil {
				t.Fatal(err)
			}
			if b.String() != c.want {
				t.Errorf("got\n%q\nwant\n%q", b.String(), c.want)
			}
		})
	}
	var b bytes.Buffer
	if err := WriteResult(&b, FormatJSON, &Result{Columns: []string{"a"}, Rows: [][]any{}}, 1); err != nil || b.String() != "[]\n" {
		t.Errorf("empty JSON result = %q, %v", b.String(), err)
	}
}

func TestWriteSecretUses(t *testing.T) {
	const p = "hmac-sha256:k1:" + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	uses := []SecretUse{{Time: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC), ToolCallID: "c1", AgentID: "a", Pointer: "/args/k", Rule: "r"}}
	var b bytes.Buffer
	if err := WriteSecretUses(&b, true, p, nil); err != nil || b.String() != `{"pseudonym":"`+p+`","uses":[]}`+"\n" {
		t.Errorf("no uses, JSON: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := WriteSecretUses(&b, false, p, uses); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"TOOL_CALL_ID", "2026-06-01T12:00:00.000Z  c1", "  -  ", "1 call(s) used this secret (pseudonym " + p + ")"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteCannedList(t *testing.T) {
	list := []Canned{{Name: "q", Help: "answers", View: "v_x", Columns: []string{"c"}, Filters: []string{FilterFrom, FilterTool}}}
	var b bytes.Buffer
	if err := WriteCannedList(&b, true, list); err != nil ||
		b.String() != `[{"name":"q","help":"answers","view":"v_x","columns":["c"],"filters":["from","tool"]}]`+"\n" {
		t.Errorf("JSON: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := WriteCannedList(&b, false, list); err != nil || b.String() != "NAME  FILTERS    VIEW  ANSWERS\nq     from,tool  v_x   answers\n" {
		t.Errorf("table: %q, %v", b.String(), err)
	}
}
