package natsauth

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

func TestPrepare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nats-auth.json")
	if a, _, err := Prepare("", PrepareOptions{Embedded: true}); a != nil || err != nil {
		t.Fatalf("no path: %v, %v", a, err)
	}
	if a, _, err := Prepare(path, PrepareOptions{Optional: true}); a != nil || err != nil {
		t.Fatalf("optional missing file: %v, %v", a, err)
	}
	if _, _, err := Prepare(path, PrepareOptions{}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("required missing file: %v", err)
	}
	a, added, err := Prepare(path, PrepareOptions{Embedded: true, EPs: []string{"demo-ep"}})
	if err != nil || a == nil || len(added) == 0 {
		t.Fatalf("embedded: file %v, added %v, %v", a, added, err)
	}
	if _, ok := a.Find("enforcement", "demo-ep"); !ok {
		t.Fatal("embedded: no user for demo-ep")
	}
	again, added, err := Prepare(path, PrepareOptions{Optional: true, EPs: []string{"other-ep"}})
	if err != nil || len(again.Users) != len(a.Users) || added != nil {
		t.Fatalf("remote: %d users (want %d), added %v, %v: the file must only be read", len(again.Users), len(a.Users), added, err)
	}
	if _, _, err := Prepare(path, PrepareOptions{Embedded: true, EPs: []string{"Bad EP"}}); !errors.Is(err, ErrBadEPID) {
		t.Fatalf("bad ep id: %v", err)
	}
}
