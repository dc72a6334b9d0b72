package enforce

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

func TestLifetime(t *testing.T) {
	now := capNow
	def := now.Add(time.Hour)
	cases := []struct {
		name string
		l    Lifetime
		want time.Time
		err  string
	}{
		{name: "default", want: def},
		{name: "ttl", l: Lifetime{TTL: time.Minute}, want: now.Add(time.Minute)},
		{name: "expires", l: Lifetime{Expires: "2025-01-15T12:00:00+01:00"}, want: now.Add(time.Hour)},
		{name: "both", l: Lifetime{TTL: time.Minute, Expires: "2025-01-15T12:00:00Z"}, err: "give --ttl or --expires, not both"},
		{name: "negative ttl", l: Lifetime{TTL: -time.Minute}, err: "--ttl must be positive"},
		{name: "bad expires", l: Lifetime{Expires: "tomorrow"}, err: "--expires: not an RFC 3339 time"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.l.ExpiresAt(now, def)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !got.Equal(c.want) {
				t.Fatalf("= %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// An issued chain and a delegation from it verify; the defaults (a new
// id, issuer-<kid>) are filled; read_only is carried; bad scopes are
// refused.
func TestIssueAndDelegateGrant(t *testing.T) {
	a := capAuthorizer(t)
	issued := capNow.Add(-time.Minute)
	chain, err := IssueChain(capKey(t, 0), "", Grant{To: capAgent(0), ToKey: capKey(t, 1).Public(),
		Scopes: []string{"tool:files:*"}, ReadOnly: true, IssuedAt: issued, ExpiresAt: capNow.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	c := chain.Capability
	if c.Issuer != "issuer-"+capKey(t, 0).KID || len(c.CapabilityID) != 36 || !c.Constraints.IsReadOnly() ||
		c.IssuedAt != issued.Format(schemas.TimeFormat) {
		t.Fatalf("issued %+v", c)
	}
	exp, err := ChainExpiresAt(chain)
	if err != nil || !exp.Equal(capNow.Add(time.Hour)) {
		t.Fatalf("ChainExpiresAt = %v, %v", exp, err)
	}
	g := Grant{ID: "cap-d1", To: capAgent(1), ToKey: capKey(t, 2).Public(), Scopes: []string{"tool:files:read_file"},
		IssuedAt: issued, ExpiresAt: exp}
	if err := DelegateGrant(capKey(t, 1), chain, g); err != nil {
		t.Fatal(err)
	}
	if res := a.VerifyChain(chain, capNow, nil); len(res.Codes) != 0 || res.Holder != capAgent(1) || !res.ReadOnly ||
		res.CapabilityIDs[1] != "cap-d1" {
		t.Fatalf("the chain does not verify: %+v", res)
	}
	f, err := DescribeChainFile("d.json", chain)
	h, _ := ChainHash(chain)
	if err != nil || f.Holder != capAgent(1) || f.ChainHash != h || len(f.CapabilityIDs) != 2 {
		t.Fatalf("DescribeChainFile = %+v, %v", f, err)
	}
	var text bytes.Buffer
	if err := f.WriteText(&text, "delegated"); err != nil || text.String() != "delegated d.json\n  capability id cap-d1\n  holder        "+
		capAgent(1)+"\n  chain hash    "+h+"\n" {
		t.Fatalf("WriteText: %q %v", text.String(), err)
	}
	if b, _ := json.Marshal(f); !strings.HasPrefix(string(b), `{"capability_ids":[`) || !strings.HasSuffix(string(b), `"holder":"`+capAgent(1)+`"}`) {
		t.Fatalf("JSON %s", b)
	}
	if _, err := IssueChain(capKey(t, 0), "ops", Grant{To: "x", ToKey: capKey(t, 1).Public(), Scopes: []string{"files"},
		IssuedAt: issued, ExpiresAt: exp}); err == nil {
		t.Fatal("a bad scope was issued")
	}
}

// The report of an inspection: JSON keys in sorted order with codes and
// details never null, the call without its resource; the text names every
// link and the verdict.
func TestInspectionReport(t *testing.T) {
	a := capAuthorizer(t)
	raw, err := json.Marshal(capChain(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	res := "/secret/path"
	q := &ScopeQuery{Server: "docs", Tool: "read", Resource: &res}
	in := a.InspectChain(raw, capNow, nil, q)
	b, err := json.Marshal(in.Report("chain.json", q, capNow))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{`{"call":{"method":"","resource":true,"server_id":"docs","tool_name":"read"},"capability_ids":`,
		`"checked_at":"2025-01-15T10:00:00.000Z","codes":["SCOPE_MISMATCH"]`, `"file":"chain.json","holder":"agent-1"`, `"valid":false}`} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, res) {
		t.Errorf("report quotes the resource:\n%s", out)
	}
	ok := a.InspectChain(raw, capNow, nil, nil)
	if b, _ := json.Marshal(ok.Report("c", nil, capNow)); !strings.Contains(string(b), `"codes":[],"details":[]`) || strings.Contains(string(b), `"call"`) {
		t.Errorf("valid report: %s", b)
	}
	var text bytes.Buffer
	if err := in.WriteText(&text, "chain.json", q, capNow); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"capability chain chain.json\n", "link 0  capability", "link 1  delegation", "  delegatee   agent-1",
		"scope check   docs:read (with resource)\n", "verdict       INVALID: SCOPE_MISMATCH (checked at 2025-01-15T10:00:00.000Z)\n", "  detail      "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

func TestNewScopeQuery(t *testing.T) {
	res := "docs/a.md"
	if q, err := NewScopeQuery("files", "read_file", "", &res); err != nil || q == nil || q.Server != "files" || q.Tool != "read_file" || q.Resource != &res {
		t.Fatalf("a call: %+v, %v", q, err)
	}
	if q, err := NewScopeQuery("", "", "", nil); err != nil || q != nil {
		t.Fatalf("no call: %+v, %v", q, err)
	}
	for _, c := range []struct {
		server, tool, method string
		resource             *string
		err                  string
	}{
		{server: "files", err: "--server and --tool go together"},
		{tool: "read_file", err: "--server and --tool go together"},
		{method: "get", err: "--method and --resource need --server and --tool"},
		{resource: &res, err: "--method and --resource need --server and --tool"},
	} {
		if _, err := NewScopeQuery(c.server, c.tool, c.method, c.resource); err == nil || err.Error() != c.err {
			t.Errorf("%+v: %v, want %q", c, err, c.err)
		}
	}
}
