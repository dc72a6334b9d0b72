package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/query/synth"
	"github.com/talos-audit/talos/receipts"
)

// synthCmd fills a ClickHouse database with signed, chained, checkpointed
// receipts without a pipeline, to measure verification at scale.
type synthCmd struct {
	Receipts        int    `name:"receipts" default:"1000000" help:"Receipts to write."`
	Chains          int    `name:"chains" default:"4" help:"Chains to spread them over (one signer goroutine each)."`
	CheckpointEvery int    `name:"checkpoint-every" default:"1000" help:"A signed checkpoint after every N receipts of a chain (and one over the rest)."`
	KeyOut          string `name:"key-out" required:"" type:"path" help:"Write the new signing key pair to NAME.key and NAME.pub (verify with --trusted-keys NAME.pub)."`
	Batch           int    `name:"batch" default:"10000" help:"Rows per ClickHouse insert."`
	Cluster         string `name:"clickhouse-cluster" help:"Create the database ON CLUSTER this ClickHouse cluster, with replicated tables (as talosd's sink)."`
}

func (c *synthCmd) Run(g *Globals) error {
	if c.Receipts < 1 || c.Chains < 1 || c.CheckpointEvery < 1 || c.Batch < 1 {
		return usage("synth: --receipts, --chains, --checkpoint-every and --batch must be positive")
	}
	key, err := receipts.GenerateKey()
	if err != nil {
		return err
	}
	if err := receipts.WriteKeyPair(key, c.KeyOut); err != nil {
		return usage("synth: %v", err)
	}
	ctx := context.Background()
	conn, err := g.Endpoint().Open(ctx, "")
	if err != nil {
		return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	defer conn.Close()
	if err := query.MigrateCluster(ctx, conn, g.ClickhouseDatabase, query.Cluster{Name: c.Cluster}); err != nil {
		return failed("%v", err)
	}
	bar := query.NewProgressBar(os.Stderr, "writing", "receipts")
	done := 0
	start := time.Now()
	err = synth.Write(ctx, conn, g.ClickhouseDatabase, key,
		synth.Options{Receipts: c.Receipts, Chains: c.Chains, CheckpointEvery: c.CheckpointEvery, Batch: c.Batch},
		func(k int) { done += k; bar.Update(done, c.Receipts) })
	bar.Done()
	if err != nil {
		return failed("synth: %v", err)
	}
	fmt.Printf("wrote %d receipts in %d chains (a checkpoint every %d) to %s database %s in %s; verify with --trusted-keys %s.pub\n",
		c.Receipts, c.Chains, c.CheckpointEvery, g.ClickhouseAddr, g.ClickhouseDatabase, time.Since(start).Round(time.Second), c.KeyOut)
	return nil
}
