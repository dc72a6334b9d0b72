package natsserver

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestStartTempDirRemoved(t *testing.T) {
	n, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := n.tempDir
	if dir == "" {
		t.Fatal("no temp dir recorded")
	}
	n.Shutdown()
	n.Shutdown() // idempotent
	if _, err := nats.Connect(n.URL(), nats.Timeout(time.Second)); err == nil {
		t.Fatal("server still accepts connections after Shutdown")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("store dir %s not removed", dir)
	}
}

func TestStartAddrInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	host, port, err := ParseAddr(busy.Addr().String())
	if err != nil || host != "127.0.0.1" || port == 0 {
		t.Fatalf("ParseAddr(%s) = %q, %d, %v", busy.Addr(), host, port, err)
	}
	start := time.Now()
	if _, err := Start(Options{Host: host, Port: port}); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Start on a busy port: %v, want ErrAddrInUse", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Start on a busy port took %s; it should fail at once", d)
	}
	for _, bad := range []string{"4222", "host:port", ""} {
		if _, _, err := ParseAddr(bad); err == nil {
			t.Errorf("ParseAddr(%q): no error", bad)
		}
	}
}
