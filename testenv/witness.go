//go:build unix

package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// witnessSources are the files of testenv/witness that decide its build.
var witnessSources = []string{"go.mod", "go.sum", "main.go", "tools.go"}

// WitnessBinaries returns litewitness (filippo.io/torchwood's C2SP
// tlog-witness) and testenv/witness's command that serves it its key and
// registers logs with it, both built once per machine (buildTools).
func WitnessBinaries() (witness, litewitness string, err error) {
	bins, err := buildTools("witness", witnessSources, "litewitness and its test harness",
		map[string]string{"witness": ".", "litewitness": "filippo.io/torchwood/cmd/litewitness"})
	if err != nil {
		return "", "", err
	}
	return bins["witness"], bins["litewitness"], nil
}

// Witness is a private litewitness on a loopback port: a witness as an
// independent party runs it, with a key of its own, that cosigns a log's
// checkpoints only if each extends the last one it saw.
type Witness struct {
	// Name is the witness's name (e.g. witness.test/w1), URL its HTTP
	// address (http://127.0.0.1:PORT; C2SP tlog-witness's add-checkpoint
	// is URL/add-checkpoint), VKey its cosignature verifier key (a note
	// verifier key of C2SP tlog-cosignature's type).
	Name, URL, VKey string

	bin, lite, dir, addr string
	proc                 child
}

// StartWitness starts a witness called name (URL-like, e.g.
// witness.test/w1) and waits until it listens; it is stopped when the test
// ends. It witnesses no log until AddLog.
func StartWitness(t testing.TB, name string) *Witness {
	t.Helper()
	bin, lite, err := WitnessBinaries()
	if err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	dir := t.TempDir()
	w := &Witness{Name: name, bin: bin, lite: lite, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		proc: child{name: "litewitness " + name, log: filepath.Join(dir, "witness.log")}}
	w.URL = "http://" + w.addr
	t.Cleanup(w.Stop)
	w.Start(t)
	return w
}

// Start starts the witness (again, after Stop or Kill) with the same key,
// database and port, and waits until it listens and has said its key.
func (w *Witness) Start(t testing.TB) {
	t.Helper()
	w.proc.start(t, 30*time.Second, []string{w.addr}, w.bin, "serve", "-dir", w.dir, "-name", w.Name, "-listen", w.addr, "-litewitness", w.lite)
	deadline := time.Now().Add(10 * time.Second)
	for w.VKey == "" {
		b, _ := os.ReadFile(w.proc.log)
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, ok := strings.CutPrefix(sc.Text(), "vkey "); ok {
				w.VKey = k
			}
		}
		if w.VKey == "" {
			if time.Now().After(deadline) {
				t.Fatalf("litewitness %s listens but said no verifier key:\n%s", w.Name, w.proc.tail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Stop stops the witness (SIGTERM, then SIGKILL after 10 s).
func (w *Witness) Stop() { w.proc.signal(syscall.SIGTERM, 10*time.Second) }

// AddLog has the witness witness the log origin, whose checkpoints
// verifier key vkey (a note verifier key) signs, from size 0.
func (w *Witness) AddLog(t testing.TB, origin, vkey string) {
	t.Helper()
	out, err := exec.Command(w.bin, "add-log", "-dir", w.dir, "-origin", origin, "-vkey", vkey).CombinedOutput()
	if err != nil {
		t.Fatalf("register log %s with witness %s: %v\n%s", origin, w.Name, err, out)
	}
}

// String names the witness for failure messages.
func (w *Witness) String() string { return fmt.Sprintf("%s at %s", w.Name, w.URL) }
