// Package natsurl reads comma-separated NATS URL lists the way the Talos
// commands need to: whether one carries credentials, and how to print them
// without the password.
package natsurl

import (
	"net/url"
	"strings"
)

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
