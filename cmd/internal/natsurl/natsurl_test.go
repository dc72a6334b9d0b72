package natsurl

import (
	"strings"
	"testing"
)

func TestHasUserAndRedact(t *testing.T) {
	for in, want := range map[string]bool{
		"nats://127.0.0.1:4222":                    false,
		"nats://a:secret@h:4222":                   true,
		"nats://h1:4222, nats://ep:secret@h2:4222": true,
		"nats://:pw@h:4222":                        false,
	} {
		if got := HasUser(in); got != want {
			t.Errorf("HasUser(%q) = %v", in, got)
		}
		if strings.Contains(Redact(in), "secret") {
			t.Errorf("Redact(%q) = %q keeps the password", in, Redact(in))
		}
	}
}
