package jspub_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/testenv"
)

// sameAsReference fails t unless ParseAck agrees on b with
// encoding/json, as nats.go decodes an acknowledgement.
func sameAsReference(t *testing.T, b []byte) {
	t.Helper()
	got, gerr := jspub.ParseAck(b)
	want, werr := jspub.ParseAckJSON(b)
	if !reflect.DeepEqual(got, want) || fmt.Sprint(gerr) != fmt.Sprint(werr) {
		t.Fatalf("ParseAck(%q) = %+v, %v; encoding/json: %+v, %v", b, got, gerr, want, werr)
	}
}

func TestParseAckAsEncodingJSON(t *testing.T) {
	for _, b := range []string{
		// As nats-server writes them.
		`{"stream":"TALOS_CALLS","seq":1}`,
		`{"stream":"TALOS_CALLS","domain":"hub","seq":18446744073709551615}`,
		`{"stream":"TALOS_AUDIT","seq":42,"duplicate": true}`,
		`{"stream":"X","seq":7,"duplicate": true,"batch":"b1","count":3}`,
		`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"X","seq":0}`,
		`{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`,
		// White space, and shapes the one-pass reader leaves to encoding/json.
		` { "stream" : "S" , "seq" : 9 , "duplicate" : false } `,
		`{"stream":"S\u0041","seq":9}`,
		`{"stream":"S","seq":9,"seq":10}`,
		`{"stream":"S","seq":09}`,
		`{"stream":"S","seq":-1}`,
		`{"stream":"S","seq":1.5}`,
		`{"stream":"S","seq":18446744073709551616}`,
		`{"stream":"","seq":9}`,
		`{"seq":9}`,
		`{"stream":"S"}`,
		`{"stream":"S","seq":9,"val":"10"}`,
		`{"stream":"S","seq":9}x`,
		`{"stream":"S","seq":9,}`,
		`{"stream":"S","seq":9,"duplicate":tru}`,
		`{"stream":"S","seq":9,"duplicate":null}`,
		`{"stream":null,"seq":9}`,
		`[]`, ``, `null`, `{`, `{"stream":"S`,
	} {
		sameAsReference(t, []byte(b))
	}
}

// TestParseAckReadsServerAcksInOnePass: what nats-server writes (see its
// stream.go) is read without encoding/json.
func TestParseAckReadsServerAcksInOnePass(t *testing.T) {
	for _, b := range []string{
		`{"stream":"TALOS_CALLS","seq":1}`,
		`{"stream":"TALOS_CALLS","domain":"hub","seq":42}`,
		`{"stream":"TALOS_AUDIT","seq":42,"duplicate": true}`,
	} {
		if !jspub.ReadsInOnePass([]byte(b)) {
			t.Errorf("%s: left to encoding/json", b)
		}
	}
}

func FuzzParseAck(f *testing.F) {
	for _, b := range []string{
		`{"stream":"TALOS_CALLS","seq":1}`,
		`{"stream":"A","domain":"d","seq":2,"duplicate": true}`,
		`{"error":{"code":503,"description":"x"}}`,
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameAsReference(t, b) })
}

func TestPublishAgainstServer(t *testing.T) {
	ns := testenv.NATSForTest(t)
	nc, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	msg := func(id string) *nats.Msg {
		m := &nats.Msg{Subject: "s.a", Data: []byte("x"), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		return m
	}
	ack, err := jspub.Publish(ctx, nc, msg("one"))
	if err != nil || ack.Stream != "S" || ack.Sequence != 1 || ack.Duplicate {
		t.Fatalf("first publish: %+v, %v", ack, err)
	}
	if ack, err = jspub.Publish(ctx, nc, msg("one")); err != nil || ack.Sequence != 1 || !ack.Duplicate {
		t.Fatalf("same Msg-Id again: %+v, %v; want a duplicate of seq 1", ack, err)
	}
	m := msg("two")
	m.Header.Set(jetstream.ExpectedLastSeqHeader, "5")
	var apiErr *jetstream.APIError
	if _, err = jspub.Publish(ctx, nc, m); !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("wrong expected last sequence: %v; want the stream's API error", err)
	}
	// New's PublishMsg: without options through Publish, with them
	// through nats.go.
	js2, err := jspub.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if ack, err = js2.PublishMsg(ctx, msg("three")); err != nil || ack.Sequence != 2 || ack.Duplicate {
		t.Fatalf("PublishMsg: %+v, %v; want seq 2", ack, err)
	}
	if _, err = js2.PublishMsg(ctx, msg("four"), jetstream.WithExpectLastSequence(1)); !errors.As(err, &apiErr) {
		t.Fatalf("PublishMsg expecting last sequence 1: %v; want the stream's API error", err)
	}
	if ack, err = js2.Publish(ctx, "s.b", []byte("y"), jetstream.WithExpectLastSequence(2)); err != nil || ack.Sequence != 3 {
		t.Fatalf("Publish expecting last sequence 2: %+v, %v; want seq 3", ack, err)
	}
	_, err = jspub.Publish(ctx, nc, &nats.Msg{Subject: "nostream.a", Data: []byte("x")})
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("no stream: %v; want ErrNoStreamResponse", err)
	}
}

// BenchmarkAck compares reading a stream's acknowledgement with
// encoding/json (as jetstream.PublishMsg does) and with ParseAck, each in
// a goroutine of its own as a publishing caller is.
func BenchmarkAck(b *testing.B) {
	ack := []byte(`{"stream":"TALOS_CALLS","seq":1234567}`)
	for _, c := range []struct {
		name  string
		parse func([]byte) (*jetstream.PubAck, error)
	}{{"encoding-json", jspub.ParseAckJSON}, {"ParseAck", jspub.ParseAck}} {
		b.Run(c.name, func(b *testing.B) {
			done := make(chan struct{})
			for b.Loop() {
				go func() {
					if _, err := c.parse(ack); err != nil {
						panic(err)
					}
					done <- struct{}{}
				}()
				<-done
			}
		})
	}
}

// connectOurs connects to a new server with testenv.ConnectJS, whose
// JetStream is New's, and fails t if it is not (the asynchronous tests
// would then be testing nats.go).
func connectOurs(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	if !jspub.IsNew(js) {
		t.Fatalf("testenv.ConnectJS gave a %T, not jspub.New's", js)
	}
	return nc, js
}

// outcome is what an asynchronous publish came to, in a form two
// implementations can be compared by.
type outcome struct {
	Ack *jetstream.PubAck
	Err string
	// APICode is the error code of an API error, delivered unwrapped.
	APICode jetstream.ErrorCode
}

func await(t *testing.T, fut jetstream.PubAckFuture, err error) outcome {
	t.Helper()
	if err != nil {
		return outcome{Err: err.Error()}
	}
	select {
	case ack := <-fut.Ok():
		return outcome{Ack: ack}
	case err := <-fut.Err():
		o := outcome{Err: err.Error()}
		if apiErr, ok := err.(*jetstream.APIError); ok {
			o.APICode = apiErr.ErrorCode
		}
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to an asynchronous publish in 10 s")
		return outcome{}
	}
}

// TestPublishMsgAsyncAsNATSGo: New's PublishMsgAsync without options comes
// to what nats.go's does, publish for publish, on two streams alike: an
// acknowledgement, a duplicate, the stream's API error (unwrapped), no
// stream after the retries, a message that already has a reply subject.
func TestPublishMsgAsyncAsNATSGo(t *testing.T) {
	nc, js := connectOurs(t)
	ref, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"OURS", "REF"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(stream, id string, hdr ...string) *nats.Msg {
		m := &nats.Msg{Subject: stream + ".a", Data: []byte("x"), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		return m
	}
	for _, c := range []struct {
		name string
		msg  func(stream string) *nats.Msg
	}{
		{"first", func(s string) *nats.Msg { return msg(s, "one") }},
		{"same Msg-Id", func(s string) *nats.Msg { return msg(s, "one") }},
		{"second", func(s string) *nats.Msg { return msg(s, "two") }},
		{"wrong last sequence", func(s string) *nats.Msg { return msg(s, "three", jetstream.ExpectedLastSeqHeader, "9") }},
		{"no stream", func(s string) *nats.Msg { return &nats.Msg{Subject: "none." + s, Data: []byte("x")} }},
		{"reply set", func(s string) *nats.Msg { return &nats.Msg{Subject: s + ".a", Reply: "r", Data: []byte("x")} }},
	} {
		fut, err := js.PublishMsgAsync(c.msg("OURS"))
		got := await(t, fut, err)
		fut, err = ref.PublishMsgAsync(c.msg("REF"))
		want := await(t, fut, err)
		if want.Ack != nil {
			want.Ack.Stream = "OURS"
		}
		want.Err = strings.ReplaceAll(want.Err, "REF", "OURS")
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v (ack %+v); nats.go: %+v (ack %+v)", c.name, got, got.Ack, want, want.Ack)
		}
	}
}

// TestPublishMsgAsyncMany: publishes from several goroutines at once each
// get their own acknowledgement.
func TestPublishMsgAsyncMany(t *testing.T) {
	_, js := connectOurs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 4, 250
	seqs := make(chan uint64, goroutines*each)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			var futs []jetstream.PubAckFuture
			for i := range each {
				m := &nats.Msg{Subject: "s.a", Data: []byte("x"), Header: nats.Header{}}
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%d-%d", g, i))
				fut, err := js.PublishMsgAsync(m)
				if err != nil {
					t.Error(err)
					return
				}
				futs = append(futs, fut)
			}
			for _, fut := range futs {
				select {
				case ack := <-fut.Ok():
					if ack.Duplicate {
						t.Errorf("%s: duplicate", fut.Msg().Header.Get(jetstream.MsgIDHeader))
					}
					seqs <- ack.Sequence
				case err := <-fut.Err():
					t.Error(err)
				case <-ctx.Done():
					t.Error("acknowledgement not received")
				}
			}
		})
	}
	wg.Wait()
	close(seqs)
	seen := map[uint64]bool{}
	for s := range seqs {
		if seen[s] || s < 1 || s > goroutines*each {
			t.Fatalf("sequence %d twice or out of range", s)
		}
		seen[s] = true
	}
	if len(seen) != goroutines*each {
		t.Fatalf("%d acknowledgements, want %d", len(seen), goroutines*each)
	}
}

// TestPublishMsgAsyncGivesUp: a publish that is never answered (here a
// subscriber that does not reply) is given up once it is stale, at the
// next publish.
func TestPublishMsgAsyncGivesUp(t *testing.T) {
	jspub.SetStaleAfter(t, 100*time.Millisecond)
	nc, js := connectOurs(t)
	sub, err := nc.SubscribeSync("silent.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	first, err := js.PublishMsgAsync(&nats.Msg{Subject: "silent.a", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Ok():
		t.Fatal("acknowledged with no stream")
	case err := <-first.Err():
		t.Fatalf("answered before it was stale: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "silent.b", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("stale publish: %v; want ErrAsyncPublishTimeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stale publish not given up")
	}
}
