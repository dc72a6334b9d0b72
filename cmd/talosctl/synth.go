package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// synthCmd fills a ClickHouse database with signed, chained, checkpointed
// receipts without a pipeline, to measure verification at scale.
type synthCmd struct {
	Receipts        int    `name:"receipts" default:"1000000" help:"Receipts to write."`
	Chains          int    `name:"chains" default:"4" help:"Chains to spread them over (one signer goroutine each)."`
	CheckpointEvery int    `name:"checkpoint-every" default:"1000" help:"A signed checkpoint after every N receipts of a chain (and one over the rest)."`
	KeyOut          string `name:"key-out" required:"" type:"path" help:"Write the new signing key pair to NAME.key and NAME.pub (verify with --trusted-keys NAME.pub)."`
	Batch           int    `name:"batch" default:"10000" help:"Rows per ClickHouse insert."`
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
	conn, err := query.Open(ctx, g.ClickhouseAddr, "")
	if err != nil {
		return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	defer conn.Close()
	if err := query.Migrate(ctx, conn, g.ClickhouseDatabase); err != nil {
		return failed("%v", err)
	}
	bar := newProgressBar(os.Stderr, "writing", "receipts")
	var done atomic.Int64
	var mu sync.Mutex // serialises the bar
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for i := range c.Chains {
		n := c.Receipts / c.Chains
		if i < c.Receipts%c.Chains {
			n++
		}
		chain := receipts.NewChain(fmt.Sprintf("synth-%d", i), key)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.fill(ctx, g, conn, chain, n, func(k int) {
				d := done.Add(int64(k))
				mu.Lock()
				bar.update(int(d), c.Receipts)
				mu.Unlock()
			})
			if err != nil {
				errOnce.Do(func() { firstErr = err; cancel() })
			}
		}()
	}
	wg.Wait()
	bar.done()
	if err := firstErr; err != nil {
		return failed("synth: %v", err)
	}
	fmt.Printf("wrote %d receipts in %d chains (a checkpoint every %d) to %s database %s in %s; verify with --trusted-keys %s.pub\n",
		c.Receipts, c.Chains, c.CheckpointEvery, g.ClickhouseAddr, g.ClickhouseDatabase, time.Since(start).Round(time.Second), c.KeyOut)
	return nil
}

// fill writes n receipts of chain, in batches.
func (c *synthCmd) fill(ctx context.Context, g *Globals, conn driver.Conn, chain *receipts.Chain, n int, progress func(int)) error {
	at := time.Now().UTC().Add(-time.Duration(n) * time.Millisecond)
	var rows []query.ReceiptRow
	var cps []query.CheckpointRow
	flush := func() error {
		if err := query.InsertReceipts(ctx, conn, g.ClickhouseDatabase, rows); err != nil {
			return err
		}
		if err := query.InsertCheckpoints(ctx, conn, g.ClickhouseDatabase, cps); err != nil {
			return err
		}
		progress(len(rows))
		rows, cps = rows[:0], cps[:0]
		return nil
	}
	for i := 1; i <= n; i++ {
		at = at.Add(time.Millisecond)
		tcid := fmt.Sprintf("%s-%012d", chain.ID(), i)
		decision, codes := schemas.DecisionAllow, []string{}
		if i%10 == 0 {
			decision, codes = schemas.DecisionDeny, []string{schemas.CodeUnknownTool}
		}
		data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", AgentID: fmt.Sprintf("agent-%d", i%50),
			ToolID: "files/read_file", Timestamp: at.Format(schemas.TimeFormat), ResultCode: decision, ToolCallID: tcid,
			TraceID: tcid, SessionID: fmt.Sprintf("sess-%d", i%1000), EPID: "synth", ServerID: "files", ToolName: "read_file",
			Phase: schemas.PhasePre, Mode: "prod", Decision: decision, ReasonCodes: codes, ToolClass: schemas.ClassRead,
			RegistryDigest: "sha256:" + fmt.Sprintf("%064x", 1), DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
		s, err := chain.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/synth", Subject: tcid, Time: at}, &data)
		if err != nil {
			return err
		}
		if err := chain.Commit(s); err != nil {
			return err
		}
		row, err := query.ReceiptRowFromEvent(s.JSON)
		if err != nil {
			return err
		}
		rows = append(rows, row)
		if i%c.CheckpointEvery == 0 || i == n {
			cp, err := chain.Checkpoint(receipts.Meta{Source: "talos://enforce/synth", Time: at}, i == n)
			if err != nil {
				return err
			}
			cr, err := query.CheckpointRowFromEvent(cp.JSON)
			if err != nil {
				return err
			}
			cps = append(cps, cr)
		}
		if len(rows) >= c.Batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
