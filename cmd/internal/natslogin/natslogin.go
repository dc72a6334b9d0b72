// Package natslogin is how the Talos commands that connect to NATS as a
// client (talosctl, talos-mcp-gateway) find their login: credentials in a
// NATS URL list, or the user of their role in talosd's users file; and how
// to print a URL list without its passwords.
package natslogin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

// User is one user of the users file talosd writes (--nats-auth).
type User struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Role     string `json:"role"`
	EPID     string `json:"ep_id,omitempty"`
}

// ReadUsers reads talosd's users file.
func ReadUsers(path string) ([]User, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Users []User `json:"users"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Users, nil
}

// Find is the first user of role; for the enforcement role, the one that
// speaks for epID.
func Find(users []User, role, epID string) (User, bool) {
	for _, u := range users {
		if u.Role == role && (role != schemas.NATSRoleEnforcement || u.EPID == epID) {
			return u, true
		}
	}
	return User{}, false
}

// HasUser reports whether any URL of a comma-separated NATS URL list
// carries a user name (nats.go then logs in with it).
func HasUser(urls string) bool {
	for _, s := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil && u.User.Username() != "" {
			return true
		}
	}
	return false
}

// Redact hides the passwords of a NATS URL list, for messages.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, s := range parts {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}
