package forward_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/forward"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// receiver is an HTTP destination: it answers fail (an HTTP status) while
// set, else 200, and keeps what it accepted by event id.
type receiver struct {
	t       *testing.T
	hec     bool
	auth    string
	fail    atomic.Int32
	refused atomic.Int64

	mu   sync.Mutex
	got  map[string][][]byte // event id → the CloudEvents received under it
	seen int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != rc.auth || r.Header.Get("Content-Type") != "application/json" {
		rc.t.Errorf("request headers %v", r.Header)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if code := rc.fail.Load(); code != 0 {
		rc.refused.Add(1)
		http.Error(w, "unavailable", int(code))
		return
	}
	body, _ := io.ReadAll(r.Body)
	objs := rc.decode(body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, o := range objs {
		rc.got[o.id] = append(rc.got[o.id], o.event)
		rc.seen++
	}
	_, _ = w.Write([]byte(`{"text":"Success","code":0}`))
}

type received struct {
	id    string
	event []byte
}

// decode reads a HEC body (JSON objects one after another) or a webhook
// body (one JSON array), checking the members each format promises.
func (rc *receiver) decode(body []byte) []received {
	var out []received
	dec := json.NewDecoder(bytes.NewReader(body))
	if !rc.hec {
		var objs []struct {
			ID    string          `json:"id"`
			Time  string          `json:"time"`
			Tool  string          `json:"tool"`
			Event json.RawMessage `json:"event"`
		}
		if err := dec.Decode(&objs); err != nil {
			rc.t.Errorf("webhook body: %v", err)
		}
		for _, o := range objs {
			if o.Tool != "files/read_file" || o.Time == "" {
				rc.t.Errorf("webhook event: %+v", o)
			}
			out = append(out, received{o.ID, o.Event})
		}
		return out
	}
	for dec.More() {
		var o struct {
			Time   *float64        `json:"time"`
			Host   string          `json:"host"`
			Source string          `json:"source"`
			Type   string          `json:"sourcetype"`
			Event  json.RawMessage `json:"event"`
			Fields map[string]any  `json:"fields"`
		}
		if err := dec.Decode(&o); err != nil {
			rc.t.Errorf("HEC body: %v", err)
			return out
		}
		if o.Time == nil || *o.Time != 1772360430.456 || o.Host != "fwd-test" || o.Source != "talos" || o.Type != "talos:cloudevent" ||
			o.Fields["tool"] != "files/read_file" || o.Fields["decision"] != "allow" {
			rc.t.Errorf("HEC event envelope: %+v", o)
		}
		id, _ := o.Fields["event_id"].(string)
		out = append(out, received{id, o.Event})
	}
	return out
}

func (rc *receiver) count() (ids, total int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got), rc.seen
}

func newReceiver(t *testing.T, hec bool, auth string) (*receiver, *httptest.Server) {
	rc := &receiver{t: t, hec: hec, auth: auth, got: map[string][][]byte{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, srv
}

// publishEvents stores n receipts in TALOS_AUDIT and returns them by id.
func publishEvents(t *testing.T, js jetstream.JetStream, from, n int) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("0190a3c2-0000-7000-8000-%012d", i)
		ce := fmt.Sprintf(`{"data":{"agent_id":"agent-%d","decision":"allow","reason_codes":[],"tool_id":"files/read_file","note":"<&> \u2028"},`+
			`"id":%q,"time":"2026-03-01T10:20:30.456Z","type":"dev.talos.receipt.decision.v1"}`, i, id)
		if _, err := js.Publish(context.Background(), schemas.ReceiptSubject(schemas.KindDecision, "files"), []byte(ce)); err != nil {
			t.Fatal(err)
		}
		out[id] = []byte(ce)
	}
	return out
}

// Two HTTP destinations, each on its own consumer: the HEC accepts while
// the webhook refuses (503); the HEC gets every event at once, in HEC's
// format with the stored CloudEvent byte for byte, and the webhook's
// events stay unacknowledged, retried, and alerted on, until it answers
// 2xx; then it gets every event, the consumers' cursors reach the end of
// the stream and the alert is resolved.
func TestHTTPDestinations(t *testing.T) {
	nc, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cr3t-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hec, hecSrv := newReceiver(t, true, "Splunk s3cr3t-token")
	hook, hookSrv := newReceiver(t, false, "Bearer s3cr3t-token")
	hook.fail.Store(http.StatusServiceUnavailable)
	alerts := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(schemas.ForwardAlertSubject("hook"), alerts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	want := publishEvents(t, js, 0, 700)
	// A log index record is no evidence: neither receiver may get it (both
	// check every event they get is one of publishEvents').
	if _, err := js.Publish(ctx, schemas.SubjectLogIndex, []byte(`{"log_origin":"log.test/talos","first_seq":1,"entries":[]}`)); err != nil {
		t.Fatal(err)
	}
	cfg := forward.Config{Destinations: []forward.Destination{
		{Name: "splunk", Type: forward.TypeHEC, URL: hecSrv.URL + "/services/collector/event", TokenFile: token, BatchEvents: 100, BatchBytes: 64 << 10},
		{Name: "hook", Type: forward.TypeWebhook, URL: hookSrv.URL + "/talos", TokenFile: token, AlertAfter: forward.Duration(300 * time.Millisecond)},
	}}
	f, err := forward.New(nc, js, cfg, forward.Options{Instance: "fwd-test", AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	testenv.WaitFor(t, 20*time.Second, func() bool { ids, _ := hec.count(); return ids == len(want) })
	stats := f.Stats()
	testenv.WaitFor(t, 10*time.Second, func() bool { return stats[1].Failures() >= 3 })
	if ids, _ := hook.count(); ids != 0 {
		t.Fatalf("the refusing webhook accepted %d events", ids)
	}
	if info := consumerInfo(t, js, "talos-forward-hook"); info.AckFloor.Stream != 0 || info.NumAckPending == 0 {
		t.Fatalf("events refused by the webhook were acked: ack floor %d, %d pending", info.AckFloor.Stream, info.NumAckPending)
	}
	down := nextAlert(t, alerts)
	if down.State != schemas.AlertDown || down.Destination != "hook" || down.Instance != "fwd-test" || down.Failures < 2 || down.Error == "" {
		t.Fatalf("down alert: %+v", down)
	}
	if stats[1].Down(time.Now()) == 0 || stats[1].Alerts() == 0 || stats[0].Failures() != 0 {
		t.Fatalf("stats: splunk failures %d, hook down %v alerts %d", stats[0].Failures(), stats[1].Down(time.Now()), stats[1].Alerts())
	}

	more := publishEvents(t, js, 700, 50)
	for k, v := range more {
		want[k] = v
	}
	hook.fail.Store(0)
	for _, rc := range []*receiver{hec, hook} {
		testenv.WaitFor(t, 30*time.Second, func() bool { ids, _ := rc.count(); return ids == len(want) })
		for id, ce := range want {
			for _, got := range rc.got[id] {
				if !bytes.Equal(got, ce) {
					t.Fatalf("event %s arrived as\n%s\nnot as stored\n%s", id, got, ce)
				}
			}
		}
	}
	for {
		if a := nextAlert(t, alerts); a.State == schemas.AlertResolved {
			break
		}
	}
	for _, name := range []string{"talos-forward-splunk", "talos-forward-hook"} {
		testenv.WaitFor(t, 10*time.Second, func() bool {
			info := consumerInfo(t, js, name)
			// The stream holds the events and the log index record.
			return info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream == uint64(len(want))+1
		})
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return stats[0].Delivered() == uint64(len(want)) && stats[1].Delivered() == uint64(len(want))
	})
	if hook.refused.Load() < 3 || stats[1].Down(time.Now()) != 0 {
		t.Fatalf("webhook refused %d requests; down %v after recovery", hook.refused.Load(), stats[1].Down(time.Now()))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A forwarder started again resumes from each consumer's cursor: the
	// events stored meanwhile arrive, and none already accepted again.
	for k, v := range publishEvents(t, js, 750, 30) {
		want[k] = v
	}
	f2, err := forward.New(nc, js, cfg, forward.Options{Instance: "fwd-test", AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() { done <- f2.Run(ctx2) }()
	testenv.WaitFor(t, 20*time.Second, func() bool { ids, _ := hec.count(); return ids == len(want) })
	testenv.WaitFor(t, 20*time.Second, func() bool { ids, _ := hook.count(); return ids == len(want) })
	time.Sleep(300 * time.Millisecond)
	for _, rc := range []*receiver{hec, hook} {
		if ids, total := rc.count(); total != ids {
			t.Errorf("after the restart %d events arrived for %d ids: accepted ones were sent again", total, ids)
		}
	}
	cancel2()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func consumerInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), schemas.StreamAudit, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func nextAlert(t *testing.T, ch <-chan *nats.Msg) schemas.ForwardAlert {
	t.Helper()
	select {
	case m := <-ch:
		var a schemas.ForwardAlert
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatal(err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no alert within 20 s")
	}
	return schemas.ForwardAlert{}
}
