// Package synth writes signed, chained, checkpointed synthetic receipts
// straight into a ClickHouse database, without a pipeline, so that
// verification can be measured at scale. The receipts are real (sealed by
// receipts.Chain with the caller's key) and verify like any others; only
// their content is made up.
package synth

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Options size a synthetic load. Every field must be positive.
type Options struct {
	Receipts        int // receipts to write in all
	Chains          int // chains to spread them over, one writer goroutine each
	CheckpointEvery int // a checkpoint after every N receipts of a chain (and one over the rest)
	Batch           int // rows per insert
}

// Write writes o.Receipts receipts signed by key into database (which
// must exist, migrated), spread over chains "synth-0" … "synth-<n-1>",
// calling progress (from any goroutine, never concurrently) with each
// batch's size. It stops at the first error, which it returns.
func Write(ctx context.Context, conn driver.Conn, database string, key *receipts.PrivateKey, o Options, progress func(rows int)) error {
	if o.Receipts < 1 || o.Chains < 1 || o.CheckpointEvery < 1 || o.Batch < 1 {
		return fmt.Errorf("synth: receipts, chains, checkpoint interval and batch must be positive")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex // serialises progress
		errOnce  sync.Once
		firstErr error
	)
	for i := range o.Chains {
		n := o.Receipts / o.Chains
		if i < o.Receipts%o.Chains {
			n++
		}
		w := &writer{conn: conn, database: database, o: o, chain: receipts.NewChain(fmt.Sprintf("synth-%d", i), key),
			progress: func(k int) { mu.Lock(); progress(k); mu.Unlock() }}
		wg.Go(func() {
			if err := w.fill(ctx, n); err != nil {
				errOnce.Do(func() { firstErr = err; cancel() })
			}
		})
	}
	wg.Wait()
	return firstErr
}

// writer fills one chain.
type writer struct {
	conn     driver.Conn
	database string
	o        Options
	chain    *receipts.Chain
	progress func(int)
	rows     []query.ReceiptRow
	cps      []query.CheckpointRow
}

// fill writes n receipts of the chain, in batches.
func (w *writer) fill(ctx context.Context, n int) error {
	at := time.Now().UTC().Add(-time.Duration(n) * time.Millisecond)
	for i := 1; i <= n; i++ {
		at = at.Add(time.Millisecond)
		if err := w.add(i, at); err != nil {
			return err
		}
		if i%w.o.CheckpointEvery == 0 || i == n {
			cp, err := w.chain.Checkpoint(receipts.Meta{Source: "talos://enforce/synth", Time: at}, i == n)
			if err != nil {
				return err
			}
			cr, err := query.CheckpointRowFromEvent(cp.JSON)
			if err != nil {
				return err
			}
			w.cps = append(w.cps, cr)
		}
		if len(w.rows) >= w.o.Batch {
			if err := w.flush(ctx); err != nil {
				return err
			}
		}
	}
	return w.flush(ctx)
}

// add seals the chain's i-th receipt (every tenth a deny) at time at.
func (w *writer) add(i int, at time.Time) error {
	tcid := fmt.Sprintf("%s-%012d", w.chain.ID(), i)
	decision, codes := schemas.DecisionAllow, []string{}
	if i%10 == 0 {
		decision, codes = schemas.DecisionDeny, []string{schemas.CodeUnknownTool}
	}
	data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", AgentID: fmt.Sprintf("agent-%d", i%50),
		ToolID: "files/read_file", Timestamp: at.Format(schemas.TimeFormat), ResultCode: decision, ToolCallID: tcid,
		TraceID: tcid, SessionID: fmt.Sprintf("sess-%d", i%1000), EPID: "synth", ServerID: "files", ToolName: "read_file",
		Phase: schemas.PhasePre, Mode: "prod", Decision: decision, ReasonCodes: codes, ToolClass: schemas.ClassRead,
		RegistryDigest: "sha256:" + fmt.Sprintf("%064x", 1), DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
	s, err := w.chain.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/synth", Subject: tcid, Time: at}, &data)
	if err != nil {
		return err
	}
	if err := w.chain.Commit(s); err != nil {
		return err
	}
	row, err := query.ReceiptRowFromEvent(s.JSON)
	if err != nil {
		return err
	}
	w.rows = append(w.rows, row)
	return nil
}

// flush inserts the pending rows and checkpoints.
func (w *writer) flush(ctx context.Context) error {
	if err := query.InsertReceipts(ctx, w.conn, w.database, w.rows); err != nil {
		return err
	}
	if err := query.InsertCheckpoints(ctx, w.conn, w.database, w.cps); err != nil {
		return err
	}
	w.progress(len(w.rows))
	w.rows, w.cps = w.rows[:0], w.cps[:0]
	return nil
}
