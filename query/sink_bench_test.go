package query

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// sinkFixtures are one record of each kind the sink projects on the hot
// path, shaped like a worker's output for a 2 KB call: a decision receipt,
// an effect receipt (with its tool effect and document hashes) and a
// ToolCallEvent carrying both redacted payloads. All are published
// (canonical) bytes.
type sinkFixtures struct {
	decision, effect, toolCall schemas.AuditRecord
}

// sinkMaker seals sink fixtures on one chain with one key.
type sinkMaker struct {
	key *receipts.PrivateKey
	ch  *receipts.Chain
}

func newSinkMaker(tb testing.TB) *sinkMaker {
	key := testKey(tb)
	return &sinkMaker{key: key, ch: receipts.NewChain("bench-0", key)}
}

// next returns the records of call i, with ids unique to i.
func (m *sinkMaker) next(tb testing.TB, i int) sinkFixtures {
	tb.Helper()
	call := fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-%012x", i)
	id := func(k int) string { return fmt.Sprintf("0190f5b2-7c1e-7%03x-8d4e-%012x", k, i) }
	docs := []schemas.DocumentHash{
		{Pointer: "/content", Hash: strings.Repeat("4", 64), SizeBytes: 1536},
		{Pointer: "/attachments/0/data", Hash: strings.Repeat("5", 64), SizeBytes: 512},
	}
	seal := func(k int, typ string, r *schemas.Receipt) schemas.AuditRecord {
		s, err := m.ch.Seal(receipts.Meta{ID: id(k), Type: typ, Source: "talos://enforce/w1", Subject: call, Time: tcAt}, r)
		if err != nil {
			tb.Fatal(err)
		}
		if err := m.ch.Commit(s); err != nil {
			tb.Fatal(err)
		}
		kind := strings.TrimSuffix(strings.TrimPrefix(typ, "dev.talos.receipt."), ".v1")
		return schemas.AuditRecord{Subject: "talos.audit.receipt." + kind + ".files", Data: s.JSON, StreamSeq: uint64(3*i + k + 1)}
	}
	base := func(kind, phase string) *schemas.Receipt {
		return &schemas.Receipt{EventType: kind, Tool: "write_file", CapabilityHash: strings.Repeat("c", 64),
			RequestHash: strings.Repeat("a", 64), AgentID: "agent-7", ToolID: "files/write_file",
			Timestamp: tcAt.Format(schemas.TimeFormat), ResultCode: schemas.DecisionAllow,
			EnvelopeHash: strings.Repeat("e", 64), ToolCallID: call, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
			CorrelationID: "q2Xo9Fh3bTz1c5Vd8KpL0w", SessionID: "sess-bench", EPID: "gw-1", ServerID: "files",
			ToolName: "write_file", Phase: phase, Mode: "prod", Decision: schemas.DecisionAllow, ReasonCodes: []string{},
			ToolClass: schemas.ClassWrite, RegistryDigest: "sha256:" + strings.Repeat("d", 64),
			DocumentHashes: docs, BatchTotalBytes: 2048, ContentHashAlg: schemas.ContentHashAlg,
			CapabilityIDs: []string{"cap-root", "cap-leaf"}, ControlSeq: 12}
	}
	decision := base(schemas.KindDecision, schemas.PhasePre)
	effect := base(schemas.KindEffect, schemas.PhasePost)
	effect.ResponseHash = strings.Repeat("f", 64)
	effect.Effect = &schemas.ToolEffect{EffectID: id(7), ToolCallID: call,
		DocumentHashes: docs, BatchTotalBytes: 2048, ContentHashAlg: schemas.ContentHashAlg}

	ev := toolCallEvent(tb, call, tcAt)
	args := canonical(tb, fmt.Sprintf(`{"path":"notes/%d.md","mode":"append","token":"[REDACTED]","content":%q}`,
		i, strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)))
	ev.Payloads.Args, ev.ArgsHash = jsonkit.Canonical(args), sha256Hex(args)
	ev.ArgsRef = "sha256:" + ev.ArgsHash
	ev.Redactions = ev.Redactions[1:]
	// The post event's effect receipt completed the record, and the call
	// had its pre decision.
	ev.ReceiptID, ev.Flags = id(1), nil
	s, err := receipts.SignEvent(m.key, receipts.Meta{ID: id(3), Type: schemas.TypeToolCall, Source: "talos://enforce/w1",
		Subject: call, Time: tcAt}, &ev)
	if err != nil {
		tb.Fatal(err)
	}
	return sinkFixtures{
		decision: seal(0, schemas.TypeReceiptDecision, decision),
		effect:   seal(1, schemas.TypeReceiptEffect, effect),
		toolCall: schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"), Data: s.JSON, StreamSeq: uint64(3*i + 3)},
	}
}

// BenchmarkSinkRecord is the sink's per-record CPU before the insert:
// decode, validate and build the row (and the artifacts) of one record,
// as SinkWriter.Write does for each record of a batch.
func BenchmarkSinkRecord(b *testing.B) {
	fx := newSinkMaker(b).next(b, 1)
	for _, bc := range []struct {
		name string
		rec  schemas.AuditRecord
	}{{"decision", fx.decision}, {"effect", fx.effect}, {"toolcall", fx.toolCall}} {
		b.Run(bc.name, func(b *testing.B) {
			p := newProjection([]schemas.AuditRecord{bc.rec})
			b.SetBytes(int64(len(bc.rec.Data)))
			b.ReportAllocs()
			defer reportCPU(b, 1)()
			for b.Loop() {
				if err := sinkRecord(p, bc.rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// sinkRecord projects rec into p, which it empties first, and fails if rec
// did not become a row.
func sinkRecord(p *projection, rec schemas.AuditRecord) error {
	p.receipts, p.calls, p.artifacts = p.receipts[:0], p.calls[:0], p.artifacts[:0]
	p.add(rec)
	if len(p.receipts)+len(p.calls) != 1 {
		return fmt.Errorf("%s: not projected: %+v", rec.Subject, p.dead)
	}
	return nil
}

// BenchmarkSinkWrite is SinkWriter.Write end to end against the test
// ClickHouse: batches of 5,000 records (the sink's default batch) in the
// hot path's mix, two receipts per ToolCallEvent. It reports wall time and
// this process's CPU per record; its ClickHouse CPU counts only the merges
// that happen to run while it writes (BenchmarkSinkWriteBatchSize waits
// for them).
func BenchmarkSinkWrite(b *testing.B) {
	ctx, conn, db := migrated(b)
	m := newSinkMaker(b)
	const n = 5000
	recs := make([]schemas.AuditRecord, 0, n+2)
	for i := 0; len(recs) < n; i++ {
		fx := m.next(b, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	w := NewSinkWriter(conn, db)
	if err := w.Write(ctx, recs[:3]); err != nil {
		b.Fatal(err)
	}
	self0, ch0 := cpuTimes()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := w.Write(ctx, recs); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	self1, ch1 := cpuTimes()
	total := float64(len(recs) * b.N)
	b.ReportMetric(total/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/total, "µs/record")
	b.ReportMetric(float64((self1-self0).Microseconds())/total, "go-cpu-µs/record")
	if ch0 > 0 {
		b.ReportMetric(float64((ch1-ch0).Microseconds())/total, "ch-cpu-µs/record")
	}
}

// reportCPU reports the process CPU time per op (and per record, for ops
// of perOp records) when the returned function runs after the loop: on a
// shared machine wall time per op also counts time spent waiting for a
// core.
func reportCPU(b *testing.B, perOp int) func() {
	start, chStart := cpuTimes()
	return func() {
		end, chEnd := cpuTimes()
		b.ReportMetric(float64((end-start).Nanoseconds())/float64(b.N*perOp), "cpu-ns/record")
		if chStart > 0 {
			b.ReportMetric(float64((chEnd-chStart).Nanoseconds())/float64(b.N*perOp), "ch-cpu-ns/record")
		}
	}
}

// cpuTimes returns the CPU time (user+system) of this process and of its
// child clickhouse-server processes (the testenv server; 0 when the
// benchmark runs against an external one).
func cpuTimes() (self, clickhouse time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15), in clock ticks.
		open, close := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || close < open || !strings.HasPrefix(string(b[open+1:close]), "clickhouse") {
			continue
		}
		f := strings.Fields(string(b[close+2:]))
		if len(f) < 13 || f[1] != me {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		clickhouse += time.Duration(ut+st) * (time.Second / 100) // USER_HZ
	}
	return self, clickhouse
}

// BenchmarkSinkWriteBatchSize is what ClickHouse spends per record as a
// function of the sink's batch size (talosd --batch-rows, or what
// --batch-age lets a batch reach): each op writes 30,000 distinct records
// (the hot path's mix) through SinkWriter in batches of the given size
// into a fresh database, then waits until the server has no merge running
// for it, so that the merges the small parts cause are counted.
func BenchmarkSinkWriteBatchSize(b *testing.B) {
	m := newSinkMaker(b)
	var recs []schemas.AuditRecord
	for i := 0; len(recs) < 30_000; i++ {
		fx := m.next(b, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	for _, size := range []int{500, 1000, 2500, 5000, 10_000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			var self, ch time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ctx, conn, db := migrated(b)
				w := NewSinkWriter(conn, db)
				self0, ch0 := cpuTimes()
				b.StartTimer()
				for from := 0; from < len(recs); from += size {
					if err := w.Write(ctx, recs[from:min(from+size, len(recs))]); err != nil {
						b.Fatal(err)
					}
				}
				for quiet, deadline := 0, time.Now().Add(30*time.Second); quiet < 4 && time.Now().Before(deadline); {
					time.Sleep(250 * time.Millisecond)
					if count(b, ctx, conn, "SELECT count() FROM system.merges WHERE database = '"+db+"'") == 0 {
						quiet++
					} else {
						quiet = 0
					}
				}
				self1, ch1 := cpuTimes()
				self, ch = self+self1-self0, ch+ch1-ch0
			}
			n := float64(b.N * len(recs))
			b.ReportMetric(float64(self.Microseconds())/n, "go-cpu-µs/record")
			b.ReportMetric(float64(ch.Microseconds())/n, "ch-cpu-µs/record")
		})
	}
}

// BenchmarkSinkDecode compares, per record, the one-pass reader of the
// published canonical form with the general decoder (encoding/json and the
// library's schema validation) that reads anything else, on the same
// bytes: the reason the sink has a fast path.
func BenchmarkSinkDecode(b *testing.B) {
	fx := newSinkMaker(b).next(b, 1)
	dec, call := fx.decision.Data, fx.toolCall.Data
	b.Run("receipt/one-pass", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := receiptRowFromEvent(dec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("receipt/general", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := receiptRowDecoded(dec, string(dec)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("toolcall/one-pass", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := ToolCallRowFromEvent(call); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("toolcall/general", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := toolCallRowValidated(call, string(call)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
