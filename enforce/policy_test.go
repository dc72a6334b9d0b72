package enforce

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const testPolicy = `{
  "rules": [
    {"name": "fs-readers", "agents": ["agent-*"], "servers": ["fs"], "tools": ["read_*", "list_*"]},
    {"name": "ops-all", "agents": ["ops"], "servers": ["*"], "tools": ["*"]}
  ],
  "rate_limits": [
    {"name": "fs-per-agent", "agents": ["*"], "servers": ["fs"], "tools": ["*"], "limit": 100, "window": "1m"},
    {"name": "reads", "agents": ["agent-*"], "servers": ["*"], "tools": ["read_*"], "limit": 5, "window": "10s"}
  ]
}`

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 2 || len(p.RateLimits) != 2 {
		t.Fatalf("parsed %d rules, %d limits", len(p.Rules), len(p.RateLimits))
	}
	if got := p.RateLimits[0].Window.Duration(); got != time.Minute {
		t.Fatalf("window = %s, want 1m", got)
	}
	if got := p.RateLimits[1].Window.Duration(); got != 10*time.Second {
		t.Fatalf("window = %s, want 10s", got)
	}
	if got := p.MaxWindow(); got != time.Minute {
		t.Fatalf("MaxWindow = %s", got)
	}
	if (*Policy)(nil).MaxWindow() != 0 {
		t.Fatal("nil policy has a window")
	}
}

func TestParsePolicyErrors(t *testing.T) {
	rule := func(extra string) string {
		return `{"rules":[{"name":"r","agents":["*"],"servers":["*"],"tools":["*"]` + extra + `}]}`
	}
	limit := func(fields string) string {
		return `{"rate_limits":[{"name":"l","agents":["*"],"servers":["*"],"tools":["*"],` + fields + `}]}`
	}
	cases := []struct{ name, in, want string }{
		{"not JSON", `{`, "unexpected EOF"},
		{"null", `null`, "must be a JSON object"},
		{"array", `[]`, "must be a JSON object"},
		{"empty input", ``, "must be a JSON object"},
		{"unknown top-level field", `{"rulez":[]}`, `unknown field "rulez"`},
		{"unknown rule field", rule(`,"effect":"deny"`), `unknown field "effect"`},
		{"trailing data", `{} {}`, "trailing data"},
		{"rule without name", `{"rules":[{"agents":["*"],"servers":["*"],"tools":["*"]}]}`, "rules[0]: name is empty"},
		{"duplicate rule", `{"rules":[{"name":"r","agents":["*"],"servers":["*"],"tools":["*"]},{"name":"r","agents":["*"],"servers":["*"],"tools":["*"]}]}`, `rule "r": name used twice`},
		{"rule without tools", `{"rules":[{"name":"r","agents":["*"],"servers":["*"]}]}`, `rule "r": tools: needs at least one pattern`},
		{"bad glob", `{"rules":[{"name":"r","agents":["["],"servers":["*"],"tools":["*"]}]}`, `rule "r": agents: pattern "["`},
		{"empty pattern", `{"rules":[{"name":"r","agents":[""],"servers":["*"],"tools":["*"]}]}`, "agents: empty pattern"},
		{"zero limit", limit(`"limit":0,"window":"1m"`), `rate limit "l": limit must be at least 1`},
		{"missing window", limit(`"limit":3`), "window 0s is outside"},
		{"numeric window", limit(`"limit":3,"window":60`), "duration must be a string"},
		{"bad window", limit(`"limit":3,"window":"soon"`), `duration "soon"`},
		{"tiny window", limit(`"limit":3,"window":"10ms"`), "window 10ms is outside"},
		{"huge window", limit(`"limit":3,"window":"9000h"`), "is outside"},
		{"limit without name", `{"rate_limits":[{"agents":["*"],"servers":["*"],"tools":["*"],"limit":1,"window":"1s"}]}`, "rate_limits[0]: name is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.in))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrPolicy) {
				t.Fatalf("error %v does not wrap ErrPolicy", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(good, []byte(testPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicy(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 2 {
		t.Fatalf("rules = %d", len(p.Rules))
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"rules":[{"name":""}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPolicy(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("error %v does not name the file", err)
	}
	if _, err := LoadPolicy(filepath.Join(dir, "missing.json")); !errors.Is(err, ErrPolicy) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestPolicyMatch(t *testing.T) {
	p, err := ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		agent, server, tool string
		ok                  bool
		rule                string
	}{
		{"agent-7", "fs", "read_file", true, "fs-readers"},
		{"agent-7", "fs", "list_dir", true, "fs-readers"},
		{"agent-7", "fs", "write_file", false, ""},
		{"agent-7", "github", "read_file", false, ""},
		{"bot-1", "fs", "read_file", false, ""},
		{"agent-", "fs", "read_", true, "fs-readers"}, // * matches the empty string
		{"ops", "github", "delete/everything", true, "ops-all"},
		{"", "fs", "read_file", false, ""},
	}
	for _, tc := range cases {
		ok, rule := p.Match(tc.agent, tc.server, tc.tool)
		if ok != tc.ok || rule != tc.rule {
			t.Errorf("Match(%q, %q, %q) = %v, %q; want %v, %q", tc.agent, tc.server, tc.tool, ok, rule, tc.ok, tc.rule)
		}
	}
}

func TestPolicyNoRulesMatchesEverything(t *testing.T) {
	var nilPolicy *Policy
	if ok, rule := nilPolicy.Match("a", "b", "c"); !ok || rule != "" {
		t.Fatalf("nil policy: %v %q", ok, rule)
	}
	p, err := ParsePolicy([]byte(`{"rate_limits":[{"name":"l","agents":["*"],"servers":["*"],"tools":["*"],"limit":1,"window":"1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.Match("anyone", "any", "thing"); !ok {
		t.Fatal("policy without rules denied a call")
	}
	empty, err := ParsePolicy([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := empty.Match("a", "b", "c"); !ok {
		t.Fatal("empty policy denied a call")
	}
}

func TestPolicyLimits(t *testing.T) {
	p, err := ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	names := func(ls []RateLimit) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Name)
		}
		return out
	}
	if got := names(p.Limits("agent-1", "fs", "read_file")); !reflect.DeepEqual(got, []string{"fs-per-agent", "reads"}) {
		t.Fatalf("limits = %v", got)
	}
	if got := names(p.Limits("ops", "fs", "write_file")); !reflect.DeepEqual(got, []string{"fs-per-agent"}) {
		t.Fatalf("limits = %v", got)
	}
	if got := p.Limits("ops", "github", "x"); got != nil {
		t.Fatalf("limits = %v, want none", got)
	}
	if got := (*Policy)(nil).Limits("a", "b", "c"); got != nil {
		t.Fatalf("nil policy limits = %v", got)
	}
}

func TestDurationJSONRoundTrip(t *testing.T) {
	d := Duration(90 * time.Second)
	b, err := d.MarshalJSON()
	if err != nil || string(b) != `"1m30s"` {
		t.Fatalf("MarshalJSON = %s, %v", b, err)
	}
	var back Duration
	if err := back.UnmarshalJSON(b); err != nil || back != d {
		t.Fatalf("UnmarshalJSON = %v, %v", back, err)
	}
}

func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(testPolicy))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"rules":[{"name":"r","agents":["a*"],"servers":["*"],"tools":["[a-"]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePolicy(b)
		if err != nil {
			if p != nil || !errors.Is(err, ErrPolicy) {
				t.Fatalf("ParsePolicy error %v with policy %v", err, p)
			}
			return
		}
		// An accepted policy survives a round trip unchanged.
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParsePolicy(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if !reflect.DeepEqual(normalisePolicy(p), normalisePolicy(back)) {
			t.Fatalf("round trip changed the policy: %s", out)
		}
		p.Match("a", "b", "c")
		p.Limits("a", "b", "c")
	})
}

// normalisePolicy makes nil and empty lists compare equal.
func normalisePolicy(p *Policy) Policy {
	q := *p
	if len(q.Rules) == 0 {
		q.Rules = nil
	}
	if len(q.RateLimits) == 0 {
		q.RateLimits = nil
	}
	return q
}
