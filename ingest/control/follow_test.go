package control_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// followSigner builds signed control events the way the control service
// does: a control receipt in talosd's chain whose Control.Seq is the
// TALOS_CONTROL sequence it will be stored at.
type followSigner struct {
	t     testing.TB
	key   *receipts.PrivateKey
	chain *receipts.Chain
	base  time.Time
}

func newFollowSigner(t testing.TB, chainID string) *followSigner {
	t.Helper()
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &followSigner{t: t, key: key, chain: receipts.NewChain(chainID, key),
		base: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (s *followSigner) keys() verify.KeySet {
	ks := verify.KeySet{}
	ks.Add(s.key.Public())
	return ks
}

// eventTime is the CloudEvent time of the event for seq.
func (s *followSigner) eventTime(seq uint64) time.Time {
	return s.base.Add(time.Duration(seq) * time.Millisecond)
}

// followRecord is an accepted control record for seq.
func followRecord(seq uint64, verb string) *schemas.ControlRecord {
	cmd := &schemas.ControlCommand{
		SchemaVersion: schemas.ControlCommandVersion,
		CommandID:     uuid.NewString(),
		Verb:          verb,
		Actor:         "responder@example.com",
		Reason:        "do-not-log-this-reason",
		IssuedAt:      "2030-01-02T03:04:05.000Z",
	}
	target := ""
	switch verb {
	case schemas.VerbKillSwitchSet, schemas.VerbKillSwitchClear:
		cmd.Scope = fmt.Sprintf("server:srv-%d", seq%7)
		target = cmd.Scope
	case schemas.VerbQuarantineSet, schemas.VerbQuarantineClear, schemas.VerbReplayFlush:
		cmd.SessionID = fmt.Sprintf("session-%d", seq)
		target = cmd.SessionID
	case schemas.VerbRevoke:
		cmd.Target = fmt.Sprintf("agent:a-%d", seq)
		target = cmd.Target
	}
	return &schemas.ControlRecord{CommandID: cmd.CommandID, Verb: verb, Actor: cmd.Actor, Reason: cmd.Reason,
		Target: target, Accepted: true, Seq: seq, CommandHash: strings.Repeat("ab", 32), Command: cmd}
}

// seal signs a control receipt around rec; edit may change the receipt
// and the CloudEvent type before signing.
func (s *followSigner) seal(seq uint64, rec *schemas.ControlRecord, edit func(*receipts.Meta, *schemas.Receipt)) []byte {
	s.t.Helper()
	r := &schemas.Receipt{
		EventType:  schemas.KindControl,
		Tool:       rec.Verb,
		Timestamp:  s.eventTime(seq).Format(schemas.TimeFormat),
		ResultCode: "accepted",
		Decision:   "accepted",
		Control:    rec,
	}
	meta := receipts.Meta{Type: schemas.TypeReceiptControl, Source: "talos://control/test",
		Subject: rec.Verb, Time: s.eventTime(seq)}
	if edit != nil {
		edit(&meta, r)
	}
	sealed, err := s.chain.Seal(meta, r)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.chain.Commit(sealed); err != nil {
		s.t.Fatal(err)
	}
	return sealed.JSON
}

// followPublishAt stores data on subject as TALOS_CONTROL sequence seq.
func followPublishAt(t testing.TB, js jetstream.JetStream, subject string, data []byte, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := js.Publish(ctx, subject, data, jetstream.WithExpectLastSequence(seq-1))
	if err != nil {
		t.Fatalf("publish control seq %d: %v", seq, err)
	}
	if ack.Sequence != seq {
		t.Fatalf("stored at %d, want %d", ack.Sequence, seq)
	}
}

var followVerbs = []string{
	schemas.VerbKillSwitchSet, schemas.VerbKillSwitchClear, schemas.VerbQuarantineSet,
	schemas.VerbQuarantineClear, schemas.VerbRevoke, schemas.VerbReplayFlush,
}

// publishValid appends valid events for seqs from..to.
func (s *followSigner) publishValid(js jetstream.JetStream, from, to uint64) {
	s.t.Helper()
	for seq := from; seq <= to; seq++ {
		verb := followVerbs[seq%uint64(len(followVerbs))]
		followPublishAt(s.t, js, schemas.ControlSubject(verb), s.seal(seq, followRecord(seq, verb), nil), seq)
	}
}

type followApplied struct {
	seq  uint64
	verb string
	at   time.Time
}

// followApplier records every Apply; it fails for the seqs in failOn.
type followApplier struct {
	mu     sync.Mutex
	got    []followApplied
	failOn map[uint64]bool
}

func (a *followApplier) Apply(seq uint64, rec *schemas.ControlRecord, at time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec.Seq != seq || rec.Command == nil {
		panic("follower applied an unchecked record")
	}
	a.got = append(a.got, followApplied{seq, rec.Verb, at})
	if a.failOn[seq] {
		return errors.New("applier refused")
	}
	return nil
}

func (a *followApplier) seqs() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]uint64, len(a.got))
	for i, g := range a.got {
		out[i] = g.seq
	}
	return out
}

func followEnsureStreams(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
}

// followRun starts f.Run and stops it (checking it returns nil) when
// the test ends.
func followRun(t *testing.T, f *control.ControlFollower) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
}

func followWaitApplied(t *testing.T, f *control.ControlFollower, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for f.Applied() < seq {
		if time.Now().After(deadline) {
			t.Fatalf("applied %d, want %d", f.Applied(), seq)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func followWantSeqs(t *testing.T, got []uint64, want ...uint64) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("applied seqs %v, want %v", got, want)
	}
}

func followSeqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestFollowReplaysThenTails(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	followEnsureStreams(t, js)
	signer := newFollowSigner(t, "talosd-control")
	const n = 1000
	signer.publishValid(js, 1, n)

	a := &followApplier{}
	type call struct {
		seq      uint64
		caughtUp bool
	}
	var mu sync.Mutex
	var calls []call
	f, err := control.NewControlFollower(js, a, control.FollowerOptions{Keys: signer.keys(),
		OnApplied: func(seq uint64, caughtUp bool) {
			mu.Lock()
			calls = append(calls, call{seq, caughtUp})
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = f.WaitCaughtUp(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || f.CaughtUp() {
		t.Fatalf("caught up before Run: %v", err)
	}

	start := time.Now()
	followRun(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := f.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("replayed %d control events in %v", n, time.Since(start))
	// Every event that existed at start is applied by the time
	// WaitCaughtUp returns, in stream order.
	followWantSeqs(t, a.seqs(), followSeqRange(1, n)...)
	if !f.CaughtUp() || f.Applied() != n || f.Last() != n || f.Rejected() != 0 {
		t.Fatalf("caughtUp %v applied %d last %d rejected %d", f.CaughtUp(), f.Applied(), f.Last(), f.Rejected())
	}
	a.mu.Lock()
	gotApplied := slices.Clone(a.got)
	a.mu.Unlock()
	for _, g := range gotApplied {
		if !g.at.Equal(signer.eventTime(g.seq)) || g.verb != followVerbs[g.seq%uint64(len(followVerbs))] {
			t.Fatalf("seq %d applied with verb %s at %v, want its event's", g.seq, g.verb, g.at)
		}
	}
	snapshot := func() []call {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	// OnApplied ran for every event before WaitCaughtUp returned.
	got := snapshot()
	if len(got) != n {
		t.Fatalf("OnApplied called %d times, want %d", len(got), n)
	}
	for i, c := range got {
		if c.seq != uint64(i+1) || c.caughtUp != (c.seq == n) {
			t.Fatalf("OnApplied call %d: %+v (caught up only at seq %d)", i, c, n)
		}
	}

	// Tail: new events are applied as they arrive.
	signer.publishValid(js, n+1, n+5)
	followWaitApplied(t, f, n+5)
	followWantSeqs(t, a.seqs(), followSeqRange(1, n+5)...)
	if f.Last() != n+5 {
		t.Fatalf("last %d, want %d", f.Last(), n+5)
	}
	for _, c := range snapshot()[n:] {
		if !c.caughtUp {
			t.Fatalf("tailed seq %d reported not caught up", c.seq)
		}
	}
}

func TestFollowEmptyStreamAndLateStream(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	signer := newFollowSigner(t, "talosd-control")
	a := &followApplier{}
	f, err := control.NewControlFollower(js, a, control.FollowerOptions{Keys: signer.keys()})
	if err != nil {
		t.Fatal(err)
	}
	// The stream does not exist yet: Run keeps trying.
	followRun(t, f)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = f.WaitCaughtUp(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caught up without a stream: %v", err)
	}
	followEnsureStreams(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Applied() != 0 || f.Last() != 0 || !f.CaughtUp() {
		t.Fatalf("empty stream: applied %d last %d", f.Applied(), f.Last())
	}
	signer.publishValid(js, 1, 2)
	followWaitApplied(t, f, 2)
	followWantSeqs(t, a.seqs(), 1, 2)
}

func TestFollowRejects(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	followEnsureStreams(t, js)
	signer := newFollowSigner(t, "talosd-control")
	stranger := newFollowSigner(t, "talosd-control") // same chain id, untrusted key
	ks := signer.keys()

	set := schemas.VerbKillSwitchSet
	first := signer.seal(1, followRecord(1, set), nil)
	type step struct {
		name    string
		subject string
		data    func(seq uint64) []byte
		ok      bool
	}
	steps := []step{
		{"valid", schemas.ControlSubject(set), func(uint64) []byte { return first }, true},
		{"unknown key", schemas.ControlSubject(set), func(seq uint64) []byte {
			return stranger.seal(seq, followRecord(seq, set), nil)
		}, false},
		{"tampered", schemas.ControlSubject(set), func(seq uint64) []byte {
			b := signer.seal(seq, followRecord(seq, set), nil)
			out := bytes.Replace(b, []byte(`"scope":"server:srv-`), []byte(`"scope":"server:xrv-`), 1)
			if bytes.Equal(out, b) {
				t.Fatal("tamper did not change the event")
			}
			return out
		}, false},
		{"re-published old event", schemas.ControlSubject(set), func(uint64) []byte { return first }, false},
		{"not accepted", schemas.ControlSubject(set), func(seq uint64) []byte {
			rec := followRecord(seq, set)
			rec.Accepted, rec.Code = false, schemas.CtlInvalid
			return signer.seal(seq, rec, nil)
		}, false},
		{"no command", schemas.ControlSubject(set), func(seq uint64) []byte {
			rec := followRecord(seq, set)
			rec.Command = nil
			return signer.seal(seq, rec, nil)
		}, false},
		{"verb mismatch", schemas.ControlSubject(set), func(seq uint64) []byte {
			rec := followRecord(seq, set)
			rec.Command.Verb = schemas.VerbKillSwitchClear
			return signer.seal(seq, rec, nil)
		}, false},
		{"read-only verb", schemas.ControlSubject(schemas.VerbKillSwitchList), func(seq uint64) []byte {
			return signer.seal(seq, followRecord(seq, schemas.VerbKillSwitchList), nil)
		}, false},
		{"wrong subject", schemas.ControlSubject(schemas.VerbQuarantineSet), func(seq uint64) []byte {
			return signer.seal(seq, followRecord(seq, set), nil)
		}, false},
		{"decision receipt", schemas.ControlSubject(set), func(seq uint64) []byte {
			return signer.seal(seq, followRecord(seq, set), func(m *receipts.Meta, r *schemas.Receipt) {
				m.Type = schemas.TypeReceiptDecision
				r.EventType = schemas.KindDecision
			})
		}, false},
		{"not json", schemas.ControlSubject(set), func(uint64) []byte { return []byte("{not json") }, false},
		{"valid after rejects, applier fails", schemas.ControlSubject(schemas.VerbRevoke), func(seq uint64) []byte {
			return signer.seal(seq, followRecord(seq, schemas.VerbRevoke), nil)
		}, true},
		{"valid", schemas.ControlSubject(set), func(seq uint64) []byte {
			return signer.seal(seq, followRecord(seq, set), nil)
		}, true},
	}
	var wantApplied []uint64
	var rejects uint64
	for i, s := range steps {
		seq := uint64(i + 1)
		followPublishAt(t, js, s.subject, s.data(seq), seq)
		if s.ok {
			wantApplied = append(wantApplied, seq)
		} else {
			rejects++
		}
	}
	last := uint64(len(steps))

	logs := &testenv.SyncBuffer{}
	a := &followApplier{failOn: map[uint64]bool{last - 1: true}}
	f, err := control.NewControlFollower(js, a, control.FollowerOptions{Keys: ks,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	followRun(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	followWantSeqs(t, a.seqs(), wantApplied...)
	if f.Applied() != last || f.Rejected() != rejects {
		t.Fatalf("applied %d rejected %d, want %d and %d\n%s", f.Applied(), f.Rejected(), last, rejects, logs)
	}
	out := logs.String()
	for i, s := range steps {
		seq := i + 1
		line := ""
		for l := range strings.Lines(out) {
			if strings.Contains(l, fmt.Sprintf(" seq=%d ", seq)) {
				line = l
			}
		}
		switch {
		case !s.ok && !strings.Contains(line, "control event rejected"):
			t.Errorf("%s (seq %d): no rejection logged:\n%s", s.name, seq, out)
		case s.ok && strings.Contains(line, "rejected"):
			t.Errorf("%s (seq %d): logged as rejected: %s", s.name, seq, line)
		}
	}
	if !strings.Contains(out, "control event not applied") {
		t.Errorf("applier failure not logged:\n%s", out)
	}
	for _, secret := range []string{"do-not-log-this-reason", "responder@example.com"} {
		if strings.Contains(out, secret) {
			t.Errorf("log holds command contents %q:\n%s", secret, out)
		}
	}
	t.Logf("log:\n%s", out)
}

func TestFollowSurvivesNATSRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts NATS")
	}
	dir := t.TempDir()
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	port := ns.NATS().Addr().(*net.TCPAddr).Port
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			ns.Shutdown()
		}
	})
	nc, js := testenv.ConnectJS(t, ns.URL())
	followEnsureStreams(t, js)
	signer := newFollowSigner(t, "talosd-control")
	signer.publishValid(js, 1, 10)

	a := &followApplier{}
	f, err := control.NewControlFollower(js, a, control.FollowerOptions{Keys: signer.keys()})
	if err != nil {
		t.Fatal(err)
	}
	followRun(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	ns.Shutdown()
	stopped = true
	ns2, err := testenv.StartNATS(testenv.NATSOptions{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns2.Shutdown)
	restarted := time.Now()
	for !nc.IsConnected() {
		if time.Since(restarted) > 30*time.Second {
			t.Fatal("client did not reconnect")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A JetStream API request sent while the restarted server is still
	// enabling JetStream can go unanswered: each attempt gets its own
	// short deadline, or one lost request would use up the whole ctx.
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err := js.Stream(actx, schemas.StreamControl)
		acancel()
		if err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("stream after restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	signer.publishValid(js, 11, 20)
	followWaitApplied(t, f, 20)
	t.Logf("tailing again %v after the restart", time.Since(restarted))
	followWantSeqs(t, a.seqs(), followSeqRange(1, 20)...)
	if f.Rejected() != 0 || f.Last() != 20 {
		t.Fatalf("rejected %d last %d", f.Rejected(), f.Last())
	}
}

func TestNewControlFollowerValidates(t *testing.T) {
	ns := testenv.NATSForTest(t)
	_, js := testenv.ConnectJS(t, ns.URL())
	if _, err := control.NewControlFollower(js, &followApplier{}, control.FollowerOptions{}); err == nil {
		t.Fatal("follower without trusted keys")
	}
	ks := newFollowSigner(t, "c").keys()
	if _, err := control.NewControlFollower(js, nil, control.FollowerOptions{Keys: ks}); err == nil {
		t.Fatal("follower without applier")
	}
	f, err := control.NewControlFollower(js, &followApplier{}, control.FollowerOptions{Keys: ks})
	if err != nil {
		t.Fatal(err)
	}
	followEnsureStreams(t, js)
	followRun(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.WaitCaughtUp(ctx); err != nil { // Run has started
		t.Fatal(err)
	}
	if err := f.Run(context.Background()); err == nil {
		t.Fatal("second Run accepted")
	}
}

// chanApplier signals each applied seq.
type chanApplier chan uint64

func (c chanApplier) Apply(seq uint64, _ *schemas.ControlRecord, _ time.Time) error {
	c <- seq
	return nil
}

// BenchmarkFollowTail measures a tailing follower: from the stream's
// publish ack of a control event to its Apply (verification included),
// the worker's share of the kill-switch budget before its heartbeat. It
// reports p50 and p99 in microseconds.
func BenchmarkFollowTail(b *testing.B) {
	ns := testenv.NATSForTest(b)
	_, js := testenv.ConnectJS(b, ns.URL())
	followEnsureStreams(b, js)
	signer := newFollowSigner(b, "talosd-control")
	events := make([][]byte, b.N)
	for i := range events {
		seq := uint64(i + 1)
		events[i] = signer.seal(seq, followRecord(seq, schemas.VerbKillSwitchSet), nil)
	}
	a := make(chanApplier, 1)
	f, err := control.NewControlFollower(js, a, control.FollowerOptions{Keys: signer.keys()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := f.WaitCaughtUp(ctx); err != nil {
		b.Fatal(err)
	}
	subject := schemas.ControlSubject(schemas.VerbKillSwitchSet)
	fromAck := make([]time.Duration, 0, b.N)
	fromPub := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i, ev := range events {
		start := time.Now()
		if _, err := js.Publish(ctx, subject, ev); err != nil {
			b.Fatal(err)
		}
		acked := time.Now()
		if got := <-a; got != uint64(i+1) {
			b.Fatalf("applied %d, want %d", got, i+1)
		}
		// Often applied before the ack reaches the publisher: ~0.
		fromAck = append(fromAck, time.Since(acked))
		fromPub = append(fromPub, time.Since(start))
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		lat  []time.Duration
	}{{"ack", fromAck}, {"pub", fromPub}} {
		slices.Sort(m.lat)
		b.ReportMetric(float64(m.lat[len(m.lat)/2].Nanoseconds())/1e3, m.name+"-p50-µs")
		b.ReportMetric(float64(m.lat[len(m.lat)*99/100].Nanoseconds())/1e3, m.name+"-p99-µs")
	}
}
