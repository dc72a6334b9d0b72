// Command witness runs litewitness (filippo.io/torchwood), a C2SP
// tlog-witness, for Talos's tests, and registers the logs it witnesses.
//
// litewitness takes its key from an ssh-agent and its logs from its SQLite
// database, which torchwood's own witnessctl edits; witnessctl cannot be
// built from the modules served here, so this command does what it does
// for a log: it inserts the log's origin and verifier key. It is a module
// of its own so that Talos itself depends on neither litewitness nor
// SQLite; testenv builds it and litewitness once per machine.
//
//	witness serve -dir DIR -name NAME -listen ADDR -litewitness BIN
//	witness add-log -dir DIR -origin ORIGIN -vkey VKEY
//
// serve keeps the witness's Ed25519 key in DIR/witness.key (created once,
// so a restart keeps the witness's identity), serves it from an in-process
// ssh-agent on DIR/agent.sock, runs litewitness on DIR/witness.db, prints
// "vkey <the witness's cosignature verifier key>" once litewitness listens,
// and stops litewitness when it gets SIGTERM or SIGINT.
package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"filippo.io/torchwood"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/mod/sumdb/note"
	"zombiezen.com/go/sqlite"
	"zombiezen.com/go/sqlite/sqlitex"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "add-log":
		err = addLog(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "witness:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: witness serve -dir DIR -name NAME -listen ADDR -litewitness BIN | witness add-log -dir DIR -origin ORIGIN -vkey VKEY")
	os.Exit(2)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dir := fs.String("dir", "", "state directory")
	name := fs.String("name", "", "the witness's name (URL-like, e.g. witness.test/w1)")
	listen := fs.String("listen", "127.0.0.1:0", "HTTP address")
	bin := fs.String("litewitness", "", "the litewitness binary")
	_ = fs.Parse(args)
	if *dir == "" || *name == "" || *bin == "" {
		return errors.New("serve needs -dir, -name and -litewitness")
	}
	key, err := loadOrCreateKey(filepath.Join(*dir, "witness.key"))
	if err != nil {
		return err
	}
	sock := filepath.Join(*dir, "agent.sock")
	fingerprint, err := serveAgent(sock, key)
	if err != nil {
		return err
	}
	signer, err := torchwood.NewCosignatureSigner(*name, key)
	if err != nil {
		return err
	}
	cmd := exec.Command(*bin, "-db", filepath.Join(*dir, "witness.db"), "-name", *name, "-listen", *listen,
		"-ssh-agent", sock, "-key", fingerprint)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start litewitness: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := awaitListen(*listen, exited); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	fmt.Printf("vkey %s\n", signer.Verifier().String())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	select {
	case <-stop:
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
		return nil
	case err := <-exited:
		return fmt.Errorf("litewitness exited: %v", err)
	}
}

// loadOrCreateKey reads the Ed25519 seed in path, or creates it.
func loadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		seed := make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(seed)), 0o600); err != nil {
			return nil, err
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if err != nil {
		return nil, err
	}
	seed, err := base64.StdEncoding.DecodeString(string(b))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: not a base64 Ed25519 seed", path)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// serveAgent serves key from an ssh-agent on sock, for as long as the
// process lives, and returns the key's SHA256 fingerprint.
func serveAgent(sock string, key ed25519.PrivateKey) (string, error) {
	ring := agent.NewKeyring()
	if err := ring.Add(agent.AddedKey{PrivateKey: key, Comment: "witness"}); err != nil {
		return "", err
	}
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return "", err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _ = agent.ServeAgent(ring, c); c.Close() }()
		}
	}()
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return "", err
	}
	return ssh.FingerprintSHA256(pub), nil
}

// awaitListen waits until addr accepts connections (30 s at most).
func awaitListen(addr string, exited <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("litewitness exited at start: %v", err)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("litewitness does not listen on %s after 30 s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// addLog registers a log in the witness's database, at size 0, as
// witnessctl add-log and add-key do; a log already there is an error.
func addLog(args []string) error {
	fs := flag.NewFlagSet("add-log", flag.ExitOnError)
	dir := fs.String("dir", "", "the witness's state directory")
	origin := fs.String("origin", "", "the log's origin")
	vkey := fs.String("vkey", "", "the log's note verifier key")
	_ = fs.Parse(args)
	v, err := note.NewVerifier(*vkey)
	if err != nil {
		return fmt.Errorf("-vkey: %w", err)
	}
	if v.Name() != *origin {
		return fmt.Errorf("-vkey names %q, not the origin %q", v.Name(), *origin)
	}
	conn, err := sqlite.OpenConn(filepath.Join(*dir, "witness.db"), sqlite.OpenReadWrite)
	if err != nil {
		return err
	}
	defer conn.Close()
	empty := sha256.Sum256(nil) // the RFC 6962 hash of the empty tree
	defer sqlitex.Save(conn)(&err)
	if err = sqlitex.Execute(conn, "INSERT INTO log (origin, tree_size, tree_hash) VALUES (?, 0, ?)", &sqlitex.ExecOptions{
		Args: []any{*origin, base64.StdEncoding.EncodeToString(empty[:])}}); err != nil {
		return fmt.Errorf("add log: %w", err)
	}
	if err = sqlitex.Execute(conn, "INSERT INTO key (origin, key) VALUES (?, ?)", &sqlitex.ExecOptions{Args: []any{*origin, *vkey}}); err != nil {
		return fmt.Errorf("add key: %w", err)
	}
	return nil
}
