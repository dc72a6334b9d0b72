package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSForTestJetStream(t *testing.T) {
	n := NATSForTest(t)
	if !strings.HasPrefix(n.URL(), "nats://127.0.0.1:") {
		t.Fatalf("URL = %q, want a loopback nats:// URL", n.URL())
	}
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != DefaultNATSMaxPayload {
		t.Fatalf("MaxPayload = %d, want %d", got, DefaultNATSMaxPayload)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 4<<20) // above the 1 MiB nats-server default
	ack, err := js.Publish(ctx, "t.big", big)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Sequence != 1 {
		t.Fatalf("seq = %d, want 1", ack.Sequence)
	}
}
