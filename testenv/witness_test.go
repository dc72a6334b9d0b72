//go:build unix

package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"filippo.io/torchwood"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// TestWitnessCosigns: a real litewitness registers a log, cosigns its
// checkpoint (the cosignature verifies with the witness's key, with
// torchwood's verifier), keeps what it saw across a restart, and refuses
// a rolled-back checkpoint (409) and a forked one (422).
func TestWitnessCosigns(t *testing.T) {
	const origin = "log.test/talos"
	w := StartWitness(t, "witness.test/w1")
	skey, vkey, err := note.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	w.AddLog(t, origin, vkey)

	// checkpoint is the signed checkpoint of the one-leaf tree holding
	// record (its root is the leaf's hash).
	checkpoint := func(record string) []byte {
		root := tlog.RecordHash([]byte(record))
		msg, err := note.Sign(&note.Note{Text: fmt.Sprintf("%s\n1\n%s\n", origin, base64.StdEncoding.EncodeToString(root[:]))}, signer)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	add := func(old int64, cp []byte) (int, []byte) {
		resp, err := http.Post(w.URL+"/add-checkpoint", "text/plain", strings.NewReader(fmt.Sprintf("old %d\n\n%s", old, cp)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	cp := checkpoint("receipt 1")
	status, cosig := add(0, cp)
	if status != http.StatusOK {
		t.Fatalf("add-checkpoint: %d %s", status, cosig)
	}
	v, err := torchwood.NewCosignatureVerifier(w.VKey)
	if err != nil {
		t.Fatal(err)
	}
	n, err := note.Open(append(cp, cosig...), note.VerifierList(v))
	if err != nil || len(n.Sigs) != 1 || n.Sigs[0].Name != w.Name {
		t.Fatalf("the cosignature does not verify with the witness's key %s: %v", w.VKey, err)
	}

	w.Stop()
	w.Start(t)
	if status, body := add(0, cp); status != http.StatusConflict {
		t.Errorf("a checkpoint from size 0 again after a restart (rollback): %d %s, want 409", status, body)
	}
	// The same size with another root: no consistency proof can join
	// them (C2SP tlog-witness answers 422).
	if status, body := add(1, checkpoint("another receipt 1")); status != http.StatusUnprocessableEntity {
		t.Errorf("a fork (size 1, another root): %d %s, want 422", status, body)
	}
}
