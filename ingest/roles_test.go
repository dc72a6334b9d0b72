package ingest_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/testenv"
)

// TestRoles: NewEnforceRole defaults to 128 x GOMAXPROCS chains named after
// the instance and shares its ledger with the control role of the same
// process; both run until their context ends; a control role alone opens
// the ledger itself.
func TestRoles(t *testing.T) {
	nc, js := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	reg, err := enforce.LoadRegistry(demoRegistry)
	if err != nil {
		t.Fatal(err)
	}
	key, signers := newSigner(t)
	engine := mustEngine(t, reg)
	ledger := kv.LedgerOptions{Window: time.Hour, Memory: true}
	en, err := ingest.NewEnforceRole(ctx, nc, js, ingest.EnforceRoleOptions{
		Instance: "Roles Test", Key: key, Engine: engine, Signers: signers, Ledger: ledger, HeartbeatInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if en.WorkerID != "roles-test" || !strings.HasPrefix(en.ChainPrefix, "roles-test-") || en.Chains != 128*runtime.GOMAXPROCS(0) {
		t.Fatalf("worker %q, chain prefix %q, %d chains", en.WorkerID, en.ChainPrefix, en.Chains)
	}
	shared, err := ingest.NewControlRole(ctx, nc, js, ingest.ControlRoleOptions{Instance: "roles-test", Key: key, Engine: engine, Signers: signers, Ledger: ledger, Enforce: en})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := ingest.NewControlRole(ctx, nc, js, ingest.ControlRoleOptions{Instance: "roles-alone", Key: key, Engine: engine, Signers: signers, Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 3)
	for _, run := range []func(context.Context) error{en.Run, shared, alone} {
		go func() { done <- run(ctx) }()
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return en.Follower().CaughtUp() })
	cancel()
	for range 3 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a role did not stop after its context ended")
		}
	}
}
