package ingest_test

import (
	"strings"
	"testing"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

func TestInstanceToken(t *testing.T) {
	for in, want := range map[string]string{"worker1": "worker1", "_Ops.Host-7_": "ops-host-7", "...": "talosd", "ÄÖ node": "node"} {
		if got := ingest.InstanceToken(in); got != want {
			t.Errorf("InstanceToken(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestChainIDs: a worker's chains are <token>-<8 hex>-<i>, a control
// service's <token>-control-<8 hex>, valid subject tokens even for the
// longest instance token, and new at each start.
func TestChainIDs(t *testing.T) {
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	token := ingest.InstanceToken(strings.Repeat("host", 20))
	chains, base, err := ingest.NewWorkerChains(token, 3, key)
	if err != nil || len(chains) != 3 {
		t.Fatalf("worker chains: %d, %v", len(chains), err)
	}
	if !strings.HasPrefix(base, token+"-") || len(base) != len(token)+9 {
		t.Fatalf("base %q", base)
	}
	for i, c := range chains {
		if want := base + "-" + string(rune('0'+i)); c.ID() != want || !schemas.ValidID(c.ID()) {
			t.Errorf("chain %d: %q, want %q and a valid subject token", i, c.ID(), want)
		}
	}
	again, base2, _ := ingest.NewWorkerChains(token, 1, key)
	if base2 == base || again[0].ID() == chains[0].ID() {
		t.Fatalf("a second start reuses the chain ids %s", base)
	}
	ctl := ingest.NewControlChain(token, key).ID()
	if !strings.HasPrefix(ctl, token+"-control-") || len(ctl) != len(token)+len("-control-")+8 || !schemas.ValidID(ctl) {
		t.Fatalf("control chain id %q", ctl)
	}
	if ctl == ingest.NewControlChain(token, key).ID() {
		t.Fatal("a second start reuses the control chain id")
	}
}
