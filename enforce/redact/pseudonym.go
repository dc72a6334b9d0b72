package redact

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
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

// LookupPseudonym is the pseudonym an auditor looks for (`talosctl query
// secret-uses`): pseudonym itself when it is given (it must be
// ValidPseudonym), else that of secret with the key file at keyPath
// (PseudonymWithKeyFile); a secret "-" is read as one line from stdin.
// The errors name talosctl's flags.
func LookupPseudonym(secret, pseudonym, keyPath string, stdin io.Reader) (string, error) {
	if pseudonym != "" {
		if !ValidPseudonym(pseudonym) {
			return "", errors.New("--pseudonym is not of the form hmac-sha256:<kid>:<64 hex digits>")
		}
		return pseudonym, nil
	}
	if secret == "-" {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read the secret from standard input: %w", err)
		}
		if secret = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"); secret == "" {
			return "", errors.New("read the secret from standard input: empty")
		}
	}
	p, err := PseudonymWithKeyFile(keyPath, secret)
	if errors.Is(err, ErrNoKey) {
		return "", fmt.Errorf("no redaction key at %s (talosd writes it under its --data-dir; pass --redaction-key)", keyPath)
	}
	return p, err
}
