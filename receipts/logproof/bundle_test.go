package logproof_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"filippo.io/torchwood"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// memLog is a log built in memory with x/mod's tlog, signed as the log
// role signs its checkpoints.
type memLog struct {
	hashes []tlog.Hash
	n      int64
	signer note.Signer
	key    note.Verifier
}

func newMemLog(t *testing.T, entries ...[]byte) *memLog {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, "audit.example.com/talos")
	if err != nil {
		t.Fatal(err)
	}
	l := &memLog{}
	l.signer, _ = note.NewSigner(skey)
	l.key, _ = note.NewVerifier(vkey)
	for _, e := range entries {
		hs, err := tlog.StoredHashes(l.n, e, l)
		if err != nil {
			t.Fatal(err)
		}
		l.hashes = append(l.hashes, hs...)
		l.n++
	}
	return l
}

func (l *memLog) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = l.hashes[x]
	}
	return out, nil
}

// checkpoint is the log's signed checkpoint, cosigned by cosigners.
func (l *memLog) checkpoint(t *testing.T, cosigners ...note.Signer) (*logproof.Checkpoint, tlog.Hash) {
	t.Helper()
	root, err := tlog.TreeHash(l.n, l)
	if err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("audit.example.com/talos\n%d\n%s\n", l.n, root)
	raw, err := note.Sign(&note.Note{Text: text}, append([]note.Signer{l.signer}, cosigners...)...)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := logproof.OpenCheckpoint(raw, l.key)
	if err != nil {
		t.Fatal(err)
	}
	return cp, root
}

func witness(t *testing.T, name string) (*torchwood.CosignatureSigner, string) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s, err := torchwood.NewCosignatureSigner(name, priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Verifier().String()
}

// A bundle verifies with public keys alone: the record's signer, the
// log's key and the witness policy; an oversize record is proved through
// its stand-in; a checkpoint short of its quorum, another log's key, or a
// proof for another index do not verify.
func TestVerifyBundle(t *testing.T) {
	key, _ := receipts.GenerateKey()
	keys := verify.KeySet{}
	keys.Add(key.Public())
	ch := receipts.NewChain("w1", key)
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	var records [][]byte
	var ids []string
	for i, payload := range []string{"small", strings.Repeat("x", logproof.MaxEntryBytes)} {
		data := schemas.Receipt{EventType: schemas.KindDecision, ToolCallID: fmt.Sprint(i), AgentID: payload, Timestamp: at.Format(schemas.TimeFormat),
			ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
		s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: fmt.Sprint(i), Time: at}, &data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		records, ids = append(records, s.JSON), append(ids, s.ID)
	}
	const subject = "talos.audit.receipt.decision.files"
	big := records[1]
	l := newMemLog(t, []byte("another entry"), records[0], logproof.StandIn(subject, ids[1], big))
	w1, vk1 := witness(t, "witness.test/w1")
	_, vk2 := witness(t, "witness.test/w2")
	policy, err := logproof.ParsePolicy(fmt.Appendf(nil, "witness w1 %s http://w1.test\nwitness w2 %s http://w2.test\ngroup one any w1 w2\ngroup both all w1 w2\nquorum one\n", vk1, vk2))
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := l.checkpoint(t, w1)
	bundle := func(record []byte, index int64) *logproof.Bundle {
		p, err := tlog.ProveRecord(l.n, index, l)
		if err != nil {
			t.Fatal(err)
		}
		return logproof.NewBundle(record, subject, index, cp, p)
	}

	res, err := logproof.VerifyBundle(bundle(records[0], 1), l.key, policy, keys)
	if err != nil || res.LogIndex != 1 || res.Oversize || res.Quorum != "one" || strings.Join(res.Cosigned, ",") != "w1" {
		t.Fatalf("bundle of entry 1: %+v, %v", res, err)
	}
	if res, err := logproof.VerifyBundle(bundle(big, 2), l.key, policy, keys); err != nil || !res.Oversize || res.Size != 3 {
		t.Fatalf("bundle of the oversize record: %+v, %v", res, err)
	}

	for name, c := range map[string]struct {
		b      *logproof.Bundle
		key    note.Verifier
		policy string
		want   string
	}{
		"another index":     {b: bundle(records[0], 2), key: l.key, want: "is not entry 2"},
		"another log's key": {b: bundle(records[0], 1), key: newMemLog(t).key, want: "not a checkpoint of the log"},
		"quorum of both":    {b: bundle(records[0], 1), key: l.key, policy: "both", want: "1 of 2 witnesses of quorum both cosigned it (missing w2)"},
	} {
		p := policy
		if c.policy != "" {
			p, _ = logproof.ParsePolicy(fmt.Appendf(nil, "witness w1 %s http://w1.test\nwitness w2 %s http://w2.test\ngroup both all w1 w2\nquorum both\n", vk1, vk2))
		}
		_, err := logproof.VerifyBundle(c.b, c.key, p, keys)
		if !errors.Is(err, logproof.ErrBundle) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
