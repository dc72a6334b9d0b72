package natslogin

import (
	"os"
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

func TestReadUsersAndFind(t *testing.T) {
	path := t.TempDir() + "/auth.json"
	body := `{"users":[{"user":"talosd","password":"w","role":"worker"},{"user":"ep-a","password":"pa","role":"enforcement","ep_id":"a"},{"user":"ep-b","password":"pb","role":"enforcement","ep_id":"b"}]}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := ReadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := Find(users, "enforcement", "b"); !ok || u.Password != "pb" {
		t.Fatalf("enforcement b: %+v %v", u, ok)
	}
	if u, ok := Find(users, "worker", "ignored"); !ok || u.User != "talosd" {
		t.Fatalf("worker: %+v %v", u, ok)
	}
	if _, ok := Find(users, "enforcement", "c"); ok {
		t.Fatal("found a user for an enforcement point that has none")
	}
	if err := os.WriteFile(path, []byte(`{"users":[],"extra":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadUsers(path); err == nil {
		t.Fatal("an unknown field was accepted")
	}
}
