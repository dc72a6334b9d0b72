package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// BenchmarkRoundTrip measures, one call in flight, what a decision costs
// in wall time against an embedded JetStream server (file storage), beside
// the floor it is built on: a decision is at least three JetStream writes
// in sequence (the call into TALOS_CALLS, its replay claim in the call
// ledger, its receipt into TALOS_AUDIT), each acknowledged, plus the
// deliveries between them. "publish" is one acknowledged 2 KB write;
// "decision" is a pre call of a 2 KB envelope from publish to decision,
// with the ledger on. Idle latency is what an enforcement point, such as
// the MCP gateway, adds to every call it forwards.
func BenchmarkRoundTrip(b *testing.B) {
	ns := testenv.NATSForTest(b)
	nc, js := testenv.ConnectJS(b, ns.URL())
	ctx := context.Background()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		b.Fatal(err)
	}
	pad := strings.Repeat("x", 1350) // with the envelope's fields, about 2 KB

	b.Run("publish", func(b *testing.B) {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RTT", Subjects: []string{"bench.rtt"}, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		data := []byte(pad)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			msg := &nats.Msg{Subject: "bench.rtt", Data: data, Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("rtt-%d", i))
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("decision", func(b *testing.B) {
		reg, err := enforce.LoadRegistry(demoRegistry)
		if err != nil {
			b.Fatal(err)
		}
		engine, err := enforce.New(enforce.Config{Mode: enforce.ModeProd, Registry: reg})
		if err != nil {
			b.Fatal(err)
		}
		ledger := newLedger(b, js)
		dec, err := enforce.NewDecider(engine, enforce.DeciderOptions{Ledger: ledger})
		if err != nil {
			b.Fatal(err)
		}
		key, err := receipts.GenerateKey()
		if err != nil {
			b.Fatal(err)
		}
		wnc, wjs := testenv.ConnectJS(b, ns.URL())
		w, err := ingest.NewWorker(wnc, wjs, dec, ingest.WorkerOptions{Source: "talos://enforce/bench",
			Chains: []*receipts.Chain{receipts.NewChain("bench-a", key), receipts.NewChain("bench-b", key)}})
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = w.Run(wctx); close(done) }()
		defer func() { cancel(); <-done }()
		client, err := ep.NewClient(nc, js, "bench-ep")
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close()

		send := func() {
			c, err := ep.NewCall("bench-ep", "files", "list_directory", map[string]string{"path": "bench/" + pad})
			if err != nil {
				b.Fatal(err)
			}
			c.SessionID = "bench-session"
			raw, err := json.Marshal(c)
			if err != nil {
				b.Fatal(err)
			}
			d, err := client.Send(ctx, schemas.PhasePre, c.ServerID, c.ToolCallID, raw)
			if err != nil {
				b.Fatal(err)
			}
			if d.Decision != schemas.DecisionAllow {
				b.Fatalf("decision %s %v, want allow", d.Decision, d.ReasonCodes)
			}
		}
		for i := 0; i < 50; i++ { // warm up: streams, consumer, ledger bucket
			send()
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			send()
		}

	})
}
