package ingest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// newSigner is a fresh signing key and a key set trusting it alone.
func newSigner(t testing.TB) (*receipts.PrivateKey, verify.KeySet) {
	t.Helper()
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keys := verify.KeySet{}
	keys.Add(key.Public())
	return key, keys
}

// background is a context that ends with the test, and run, which runs
// each function on it in a goroutine; the test's cleanup cancels the
// context and waits for them.
func background(t testing.TB) (ctx context.Context, run func(...func(context.Context) error)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ctx, func(fns ...func(context.Context) error) {
		for _, fn := range fns {
			wg.Go(func() { _ = fn(ctx) })
		}
	}
}

// do sends cmd and returns its reply, failing the test if none came.
func do(t *testing.T, c *control.ControlClient, cmd *schemas.ControlCommand) *schemas.ControlReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := c.Do(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// streamMsgs returns the messages stored in stream name, in order.
