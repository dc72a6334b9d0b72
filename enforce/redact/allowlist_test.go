package redact

import (
	"strings"
	"testing"
)

// TestGlobalAllowlistWordsAnchored: a token that ends in "null", holds
// "false" or starts with "true" is still a secret (gitleaks' global
// allowlist regex (?i)^true|false|null$ would allow it), while a value
// that is one of those words is still allowed.
func TestGlobalAllowlistWordsAnchored(t *testing.T) {
	r, err := NewLogRedactor("k")
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{
		"ghp_QVehoU1nvdPZEm7raKeumboYeAHwFl8SnulL", // the property test's seed 1795679112769267028
		"ghp_QVehoU1nvdPZfalseaKeumboYeAHwFl8Snu1",
	} {
		out, found, err := r.Redact(map[string]any{"input": "using " + token + " for the upload"}, "/args")
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != 1 || strings.Contains(out.(map[string]any)["input"].(string), token) {
			t.Errorf("%s: %v %v, want it redacted", token, out, found)
		}
	}
	rs, err := loadRuleset()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range rs.global {
		for _, word := range []string{"null", "False", "TRUE"} {
			if !a.RegexAllowed(word) {
				t.Errorf("the global allowlist no longer allows %q", word)
			}
		}
	}
}
