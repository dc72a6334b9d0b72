package loadgen

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsserver"
)

// Connect spreads the clients over the connections it dials, and closeAll
// closes every one of them, also after a failed dial.
func TestConnect(t *testing.T) {
	srv, err := natsserver.Start(natsserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	var dialed []*nats.Conn
	dial := func() (*nats.Conn, error) {
		nc, err := nats.Connect(srv.URL())
		if err == nil {
			dialed = append(dialed, nc)
		}
		return nc, err
	}
	clients, closeAll, err := Connect(2, 5, "bench-t", dial)
	if err != nil {
		t.Fatal(err)
	}
	if len(dialed) != 2 || len(clients) != 5 {
		t.Fatalf("%d connections, %d clients", len(dialed), len(clients))
	}
	closeAll()
	for i, nc := range dialed {
		if !nc.IsClosed() {
			t.Errorf("connection %d left open", i)
		}
	}

	dialed = nil
	refused := errors.New("refused")
	n := 0
	_, closeAll, err = Connect(3, 5, "bench-u", func() (*nats.Conn, error) {
		if n++; n == 2 {
			return nil, refused
		}
		return dial()
	})
	if !errors.Is(err, refused) || closeAll == nil {
		t.Fatalf("Connect = %v", err)
	}
	closeAll()
	if len(dialed) != 1 || !dialed[0].IsClosed() {
		t.Fatalf("after a failed dial: %d connections, the first closed: %v", len(dialed), len(dialed) > 0 && dialed[0].IsClosed())
	}
}

// Profile.Start writes a CPU profile that stop completes, creates the
// started file, and its stop may be called twice; the zero Profile does
// nothing.
func TestProfileStart(t *testing.T) {
	dir := t.TempDir()
	p := Profile{CPUProfile: filepath.Join(dir, "cpu.pprof"), StartedFile: filepath.Join(dir, "started")}
	stop, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.StartedFile); err != nil {
		t.Fatalf("started file: %v", err)
	}
	stop()
	stop()
	if fi, err := os.Stat(p.CPUProfile); err != nil || fi.Size() == 0 {
		t.Fatalf("CPU profile: %v %v", fi, err)
	}
	stop, err = Profile{}.Start()
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := (Profile{StartedFile: filepath.Join(dir, "missing", "started")}).Start(); err == nil {
		t.Fatal("a started file in a missing directory: no error")
	}
}

// WriteJSONFile writes one JSON line, and nothing without a path.
func TestWriteJSONFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "res.json")
	if err := WriteJSONFile(path, map[string]int{"calls": 3}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "{\"calls\":3}\n" {
		t.Fatalf("%q %v", b, err)
	}
	if err := WriteJSONFile("", map[string]int{}); err != nil {
		t.Fatal(err)
	}
}
