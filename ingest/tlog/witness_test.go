package tlog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/torchwood"
	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/note"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestWitnessedCheckpoints, against two real litewitness processes and a
// policy needing both: the published checkpoint carries the log's
// signature and both cosignatures (checked with x/mod's note and
// torchwood's verifiers, and by the policy); with one witness down the
// log goes on appending but publishes no checkpoint past what both
// cosigned, and the stalled alert is raised, then resolved once the
// witness is back; a fork of the log (same origin and key, another
// history) is never published, since the witnesses refuse it.
func TestWitnessedCheckpoints(t *testing.T) {
	const origin = "audit.example.com/talos"
	key, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "log.key"), origin, true)
	if err != nil {
		t.Fatal(err)
	}
	w1, w2 := testenv.StartWitness(t, "witness.test/w1"), testenv.StartWitness(t, "witness.test/w2")
	policy := filepath.Join(t.TempDir(), "witnesses.policy")
	body := fmt.Sprintf("witness w1 %s %s\nwitness w2 %s %s\ngroup both all w1 w2\nquorum both\n", w1.VKey, w1.URL, w2.VKey, w2.URL)
	if err := os.WriteFile(policy, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	group, err := ParseWitnessPolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*testenv.Witness{w1, w2} {
		w.AddLog(t, origin, key.Verifier)
	}
	open := func(dir string) *Log {
		l, err := Open(Options{Dir: dir, Key: key, CheckpointInterval: 100 * time.Millisecond, BatchAge: 10 * time.Millisecond,
			Witnesses: group, WitnessTimeout: 2 * time.Second, Heartbeat: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := context.Background()
	add := func(l *Log, entries ...string) {
		for _, e := range entries {
			if _, err := l.Add(ctx, []byte(e))(); err != nil {
				t.Fatal(err)
			}
		}
	}
	published := func(l *Log) uint64 {
		n, err := l.Published()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	dir := filepath.Join(t.TempDir(), "tlog")
	l := open(dir)
	defer l.Close(5 * time.Second)
	add(l, "r1", "r2", "r3")
	testenv.WaitFor(t, 20*time.Second, func() bool { return published(l) == 3 })
	cp, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	logV, _ := note.NewVerifier(key.Verifier)
	c1, _ := torchwood.NewCosignatureVerifier(w1.VKey)
	c2, _ := torchwood.NewCosignatureVerifier(w2.VKey)
	n, err := note.Open(cp, note.VerifierList(logV, c1, c2))
	if err != nil || len(n.Sigs) != 3 {
		t.Fatalf("the published checkpoint does not carry the log's signature and both cosignatures: %v\n%s", err, cp)
	}
	if !group.Satisfied(cp) {
		t.Fatal("the policy is not satisfied by the published checkpoint")
	}

	// One witness down: appends go on, the checkpoint stays where both
	// witnesses last cosigned, and the stalled alert goes out.
	nc, _ := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	alerts := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(LogAlertSubject, alerts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go l.watchPublished(wctx, nc, 2*time.Second)
	w2.Stop()
	add(l, "r4", "r5")
	alert := nextStalled(t, alerts, 20*time.Second)
	if alert.State != schemas.AlertDown || alert.Origin != origin || alert.Integrated != 5 || alert.Published != 3 {
		t.Fatalf("stalled alert: %+v", alert)
	}
	if got := published(l); got != 3 {
		t.Fatalf("with a witness of the quorum down, a checkpoint of size %d was published", got)
	}
	w2.Start(t)
	testenv.WaitFor(t, 30*time.Second, func() bool { return published(l) == 5 })
	for a := nextStalled(t, alerts, 10*time.Second); a.State != schemas.AlertResolved; a = nextStalled(t, alerts, 10*time.Second) {
	}

	// A fork: the same key and origin, another history. The witnesses have
	// seen size 5 of the real log and cosign nothing of this one, not even
	// its first (empty) checkpoint: it cannot be opened.
	_, err = Open(Options{Dir: filepath.Join(t.TempDir(), "fork"), Key: key, CheckpointInterval: 100 * time.Millisecond,
		Witnesses: group, WitnessTimeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "witness policy was not satisfied") {
		t.Fatalf("a fork of the log opened: %v", err)
	}
}

func nextStalled(t *testing.T, alerts <-chan *nats.Msg, within time.Duration) StalledAlert {
	t.Helper()
	select {
	case m := <-alerts:
		var a StalledAlert
		if err := json.Unmarshal(m.Data, &a); err != nil || !strings.HasPrefix(a.Alert, "log_") {
			t.Fatalf("alert %s: %v", m.Data, err)
		}
		return a
	case <-time.After(within):
		t.Fatalf("no log alert within %v", within)
	}
	return StalledAlert{}
}
