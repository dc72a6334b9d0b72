package natsserver

import (
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
