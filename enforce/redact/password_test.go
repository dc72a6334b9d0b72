package redact

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPasswordAssignment: a password assigned in an env file, YAML or a
// command line is redacted whatever its entropy; prose about passwords
// and JSON members left to the field-name rule are not touched by it.
func TestPasswordAssignment(t *testing.T) {
	r := newTestRedactor(t, "pw")
	for _, tc := range []struct{ text, secret string }{
		{"AWS_REGION=eu-west-1\nDB_PASSWORD=hunter2\n", "hunter2"},
		{"db:\n  password: s3cr3t-pw\n", "s3cr3t-pw"},
		{"mysql --password=letmein -h db", "letmein"},
		{"smtp_passwd = 'qwerty123'", "qwerty123"},
	} {
		out, found, err := r.Redact(map[string]any{"content": tc.text}, "/args")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(out)
		if strings.Contains(string(b), tc.secret) || len(found) == 0 ||
			found[0].Rule != RuleSecretAssignment && found[0].Rule != RuleSecretFlag || found[0].Pseudonym != r.Pseudonym(tc.secret) {
			t.Errorf("%q: %s %+v", tc.text, b, found)
		}
	}
	for _, text := range []string{
		"Reset the password from the settings page.",
		"password: required",
		"PASSWORD=${DB_PASSWORD}",
	} {
		_, found, err := r.Redact(map[string]any{"content": text}, "/args")
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != 0 {
			t.Errorf("%q: false positive %+v", text, found)
		}
	}
}
