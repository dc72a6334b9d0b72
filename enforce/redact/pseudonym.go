package redact

import (
	"regexp"
)

// pseudonymPattern is the form of a pseudonym as the ToolCallEvent schema
// has it: "hmac-sha256:<key_id>:<64 lowercase hex digits>", the key id
// without colons or white space.
var pseudonymPattern = regexp.MustCompile(`^hmac-sha256:[^:\s]+:[0-9a-f]{64}$`)

// ValidPseudonym reports whether s has the form Pseudonym returns.
func ValidPseudonym(s string) bool { return pseudonymPattern.MatchString(s) }

// PseudonymWithKeyFile returns the pseudonym talosd records for secret,
// computed with the redaction key file at keyPath (see LoadOrCreateKey):
// what an auditor looks up to find every call that used the secret
// (`talosctl query secret-uses`). The key is never created here, since a
// new key would match nothing: a missing file is ErrNoKey.
func PseudonymWithKeyFile(keyPath, secret string) (string, error) {
	key, kid, err := LoadOrCreateKey(keyPath, false)
	if err != nil {
		return "", err
	}
	r, err := New(Config{Key: key, KeyID: kid})
	if err != nil {
		return "", err
	}
	return r.Pseudonym(secret), nil
}
