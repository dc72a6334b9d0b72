package ingest_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/checkpoint"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }

// demoRegistry is the registry `talosd dev` ships; the pipeline tests use it
// so that what the demo shows is what is tested.
const demoRegistry = "../cmd/talosd/demo/registry"

// stack is a real pipeline: embedded NATS JetStream, a private ClickHouse
// database, an enforce worker and a sink, and one enforcement point.
type stack struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	conn   driver.Conn
	db     string
	reg    *enforce.Registry
	keys   verify.KeySet
	client *ep.Client
	dec    *enforce.Decider

	natsURL    string
	natsOpts   []nats.Option        // log in to natsURL (stackOptions.natsOpts)
	key        *receipts.PrivateKey // signs the worker's chains
	workerOpts ingest.WorkerOptions // of the stack's worker
}

type stackOptions struct {
	mode             enforce.Mode
	maxEnvelopeBytes int
	// natsURL and chAddr point the stack at servers a test controls (to
	// stop and restart them); empty means a fresh embedded NATS and a
	// database on the package's shared ClickHouse.
	natsURL string
	chAddr  string
	// natsOpts log the stack's connections in (a server with users).
	natsOpts []nats.Option
	// registry replaces the demo registry (a manifest file or directory).
	registry string
	// configure adds checks to the worker's Decider (capabilities,
	// ledger, redactor, ...), given the stack's JetStream.
	configure func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions)
	// checkpoints replaces the worker's checkpoint settings (default: a
	// checkpoint every 7 receipts of a chain).
	checkpoints *checkpoint.Options
	// maxBatch is the worker's MaxBatch (0: its default), and the worker
	// then has two lanes of that many chains.
	maxBatch int
	// workerJS, if set, wraps the JetStream handle of the worker (which has
	// a connection of its own, nc), to inject faults.
	workerJS func(js jetstream.JetStream, nc *nats.Conn) jetstream.JetStream
	// noWorker leaves the worker out (a test starts its own with
	// startWorker).
	noWorker bool
	// duplicateWindow replaces the streams' Nats-Msg-Id window (default
	// two minutes).
	duplicateWindow time.Duration
}

func newStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	var addr, db string
	if o.chAddr != "" {
		addr, db = o.chAddr, "talos_outage"
	} else {
		addr, db = testenv.NewDatabase(t)
	}
	natsURL := o.natsURL
	if natsURL == "" {
		natsURL = testenv.NATSForTest(t).URL()
	}
	ctx, cancel := context.WithCancel(context.Background())

	conn, err := query.Open(ctx, addr, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, o.natsOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{DuplicateWindow: o.duplicateWindow}); err != nil {
		t.Fatal(err)
	}
	regPath := demoRegistry
	if o.registry != "" {
		regPath = o.registry
	}
	reg, err := enforce.LoadRegistry(regPath)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := enforce.New(enforce.Config{Mode: o.mode, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	dopts := enforce.DeciderOptions{MaxEnvelopeBytes: o.maxEnvelopeBytes}
	if o.configure != nil {
		o.configure(t, js, &dopts)
	}
	dec, err := enforce.NewDecider(engine, dopts)
	if err != nil {
		t.Fatal(err)
	}
	key, keys := newSigner(t)
	// Two lanes of maxBatch chains (one lane of two by default): a lane
	// puts each receipt of a batch into a chain of its own.
	chains := []*receipts.Chain{receipts.NewChain("test-a", key), receipts.NewChain("test-b", key)}
	if o.maxBatch > 0 {
		chains = nil
		for i := range 2 * o.maxBatch {
			chains = append(chains, receipts.NewChain(fmt.Sprintf("test-%d", i), key))
		}
	}
	// A short AckWait: a redelivery (after an outage) shows up within the
	// tests' waits instead of after the 30 s default.
	// Checkpoints every 7 receipts per chain: every test exercises them,
	// and VerifyDatabase checks them.
	cpo := checkpoint.Options{Every: 7}
	if o.checkpoints != nil {
		cpo = *o.checkpoints
	}
	s := &stack{nc: nc, js: js, conn: conn, db: db, reg: reg, keys: keys, dec: dec, natsURL: natsURL, natsOpts: o.natsOpts, key: key,
		workerOpts: ingest.WorkerOptions{Chains: chains, Source: "talos://enforce/test", AckWait: 3 * time.Second,
			Checkpoints: cpo, MaxBatch: o.maxBatch}}
	if !o.noWorker {
		s.startWorker(t, s.workerOpts, o.workerJS)
	}
	sink, err := ingest.NewSink(js, query.NewSinkWriter(conn, db), ingest.SinkOptions{BatchAge: 50 * time.Millisecond, AckWait: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 1)
	go func() { _ = sink.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done })

	client, err := ep.NewClient(nc, js, "test-ep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s.client = client
	return s
}

// startWorker runs an enforce worker of the stack's decider with options
// o, on a NATS connection of its own (wrapped by wrap, if set), until the
// test ends or stop is called; stop returns once the worker has stopped.
func (s *stack) startWorker(t *testing.T, o ingest.WorkerOptions, wrap func(jetstream.JetStream, *nats.Conn) jetstream.JetStream) (stop func()) {
	t.Helper()
	nc, err := nats.Connect(s.natsURL, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, s.natsOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var js jetstream.JetStream
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		js = wrap(js, nc)
	}
	w, err := ingest.NewWorker(nc, js, s.dec, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func (s *stack) call(t *testing.T, c *schemas.ToolCall) *schemas.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d, err := s.client.Call(ctx, c)
	if err != nil {
		t.Fatalf("call %s/%s: %v", c.ServerID, c.ToolName, err)
	}
	checkDecision(t, d)
	return d
}

// checkDecision asserts a decision reply is well-formed: it validates
// against decision.schema.json (which validates the embedded receipt) and
// its receipt verifies.
func checkDecision(t *testing.T, d *schemas.Decision) {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := schemas.ValidateDecision(b); err != nil {
		t.Fatalf("decision does not validate: %v\n%s", err, b)
	}
}

// waitRows waits until the view holds n rows matching where.
func (s *stack) waitRows(t *testing.T, view, where string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var got uint64
	for time.Now().Before(deadline) {
		err := s.conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM %s.%s WHERE %s", s.db, view, where)).Scan(&got)
		if err == nil && got >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s WHERE %s: %d rows, want %d", view, where, got, n)
}

// newLedger returns the call ledger (TALOS_LEDGER, default options) on js.
func newLedger(t testing.TB, js jetstream.JetStream) *kv.Ledger {
	t.Helper()
	ledger, err := kv.NewLedger(context.Background(), js, kv.LedgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ledger
}

func newCall(t *testing.T, server, tool string, args any) *schemas.ToolCall {
	t.Helper()
	c, err := ep.NewCall("test-ep", server, tool, args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestPipelineReasonCodes drives every REG reason code and VAL-HTC-001 through
// real NATS and ClickHouse: each decision reaches talos.decision.<ep_id>,
// one signed receipt per call lands in talos.receipts, the whole database
// verifies, and then a tampered and a deleted row are each named.
func TestPipelineReasonCodes(t *testing.T) {
	s := newStack(t, stackOptions{maxEnvelopeBytes: 256 << 10})
	digest := s.reg.Digest()
	body := "Fixes the flaky test.\n"
	prArgs := func(b string) map[string]any {
		return map[string]any{"title": "Fix", "body": b, "files": []any{map[string]any{"path": "a.go", "content": "package a\n"}}}
	}
	cases := []struct {
		name  string
		call  *schemas.ToolCall
		tweak func(*schemas.ToolCall)
		want  string
		codes []string
	}{
		{name: "allow read", call: newCall(t, "files", "list_directory", map[string]any{"path": "."}),
			want: "allow", codes: []string{}},
		{name: "allow write with key and matching hash", call: newCall(t, "github", "create-pr", prArgs(body)),
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "k1"
				c.RegistryDigest = digest
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: sha(body)}}
			}, want: "allow", codes: []string{}},
		{name: "unknown tool", call: newCall(t, "files", "rm_rf", map[string]any{}),
			want: "deny", codes: []string{schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}},
		{name: "unknown server", call: newCall(t, "nosuch", "anything", map[string]any{}),
			want: "deny", codes: []string{schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}},
		{name: "declared class differs", call: newCall(t, "github", "list-prs", map[string]any{}),
			tweak: func(c *schemas.ToolCall) { c.ToolClass = "write" },
			want:  "deny", codes: []string{schemas.CodeToolClassDeclarationMismatch}},
		{name: "registry digest differs", call: newCall(t, "files", "list_directory", map[string]any{"path": "."}),
			tweak: func(c *schemas.ToolCall) { c.RegistryDigest = "sha256:" + strings.Repeat("0", 64) },
			want:  "deny", codes: []string{schemas.CodeRegistryVersionMismatch}},
		{name: "write without idempotency key", call: newCall(t, "files", "write_file", map[string]any{"path": "a", "content": "x"}),
			want: "deny", codes: []string{schemas.CodeIdempotencyKeyRequired}},
		{name: "document hash mismatch", call: newCall(t, "github", "create-pr", prArgs(body+"rm -rf /\n")),
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "k2"
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: sha(body)}}
			}, want: "deny", codes: []string{schemas.CodeDocHashMismatch}},
		{name: "document pointer missing", call: newCall(t, "github", "create-pr", map[string]any{"title": "x", "body": "y"}),
			tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "k3" },
			want:  "deny", codes: []string{schemas.CodeDocContentPointerInvalid}},
		{name: "document not base64", call: newCall(t, "files", "upload_blob", map[string]any{"data": "%%% not base64"}),
			tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "k4" },
			want:  "deny", codes: []string{schemas.CodeDocEncodingInvalid}},
		{name: "document too large", call: newCall(t, "files", "upload_blob", map[string]any{"data": base64.StdEncoding.EncodeToString(make([]byte, 70000))}),
			tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "k5" },
			want:  "deny", codes: []string{schemas.CodeDocSizeExceeded}},
		{name: "read-only capability on a write tool", call: newCall(t, "files", "write_file", map[string]any{"path": "a", "content": "x"}),
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "k6"
				c.Capability = json.RawMessage(`{"capability_id":"cap-1","constraints":{"read_only":true}}`)
			}, want: "deny", codes: []string{schemas.CodeToolClassMismatch}},
		{name: "request hash differs", call: newCall(t, "files", "list_directory", map[string]any{"path": "."}),
			tweak: func(c *schemas.ToolCall) { c.RequestHash = sha("something else") },
			want:  "deny", codes: []string{schemas.CodeRequestHashMismatch}},
		{name: "every reason listed", call: newCall(t, "files", "write_file", map[string]any{"path": "a", "content": "x"}),
			tweak: func(c *schemas.ToolCall) {
				c.ToolClass = "read"
				c.RegistryDigest = "sha256:" + strings.Repeat("1", 64)
			}, want: "deny", codes: []string{schemas.CodeRegistryVersionMismatch, schemas.CodeToolClassDeclarationMismatch, schemas.CodeIdempotencyKeyRequired}},
	}
	ids := map[string]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tweak != nil {
				tc.tweak(tc.call)
			}
			d := s.call(t, tc.call)
			if d.Decision != tc.want {
				t.Fatalf("decision %s %v, want %s %v (details %v)", d.Decision, d.ReasonCodes, tc.want, tc.codes, d.Details)
			}
			got := slices.Clone(d.ReasonCodes)
			want := slices.Clone(tc.codes)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("reason codes %v, want %v (details %v)", d.ReasonCodes, tc.codes, d.Details)
			}
			if d.RegistryDigest != digest {
				t.Fatalf("registry digest %s, want %s", d.RegistryDigest, digest)
			}
			ids[tc.name] = d.ReceiptID
		})
	}

	// Malformed envelopes: VAL-HTC-001 and nothing else, with a receipt.
	valid := newCall(t, "files", "list_directory", map[string]any{"path": "."})
	raw, _ := json.Marshal(valid)
	deep := strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200)
	malformed := []struct {
		name string
		raw  []byte
		id   string
	}{
		{"duplicate keys", []byte(strings.Replace(string(raw), `"phase":"pre"`, `"phase":"pre","phase":"pre"`, 1)), valid.ToolCallID},
		{"schema violation", []byte(strings.Replace(string(raw), `"transport":"mcp"`, `"transport":"carrier-pigeon"`, 1)), valid.ToolCallID},
		{"unknown field", []byte(strings.Replace(string(raw), `{`, `{"surprise":1,`, 1)), valid.ToolCallID},
		{"too deep", []byte(strings.Replace(string(raw), `"arguments":{"path":"."}`, `"arguments":{"x":`+deep+`}`, 1)), valid.ToolCallID},
		{"too large", []byte(strings.Replace(string(raw), `"arguments":{"path":"."}`, `"arguments":{"x":"`+strings.Repeat("A", 300<<10)+`"}`, 1)), valid.ToolCallID},
	}
	for i, m := range malformed {
		t.Run("VAL-HTC-001/"+m.name, func(t *testing.T) {
			// Each envelope reuses one valid call's ids; a fresh id per case
			// keeps them apart.
			id := fmt.Sprintf("01900000-0000-7000-8000-%012d", i)
			body := []byte(strings.ReplaceAll(string(m.raw), m.id, id))
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			d, err := s.client.Send(ctx, schemas.PhasePre, "files", id, body)
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, d)
			if d.Decision != "deny" || !slices.Equal(d.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) {
				t.Fatalf("got %s %v, want deny [VAL-HTC-001]", d.Decision, d.ReasonCodes)
			}
			if len(d.Details) == 0 {
				t.Fatal("a VAL-HTC-001 deny should say why")
			}
		})
	}
	// Not JSON at all: no id to answer to, but still a receipt, named by
	// the hash of what was received.
	garbage := []byte("this is not json")
	if err := s.client.Publish(context.Background(), schemas.PhasePre, "files", "", garbage); err != nil {
		t.Fatal(err)
	}
	s.waitRows(t, query.ViewReceipts, fmt.Sprintf("envelope_hash = '%s' AND has(reason_codes, 'VAL-HTC-001')", sha(string(garbage))), 1)
	// ...and auditors see it in v_decisions too, although it has no tool_call_id.
	s.waitRows(t, query.ViewDecisions, "tool_call_id = '' AND decision = 'deny'", 1)

	total := uint64(len(cases) + len(malformed) + 1)
	s.waitRows(t, query.ViewReceipts, "1", total)

	// Exactly one receipt per call and phase, in the raw table too.
	var dupCalls uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT count() FROM (SELECT tool_call_id, phase, uniqExact(receipt_id) AS n FROM %s.receipts GROUP BY tool_call_id, phase HAVING n > 1)", s.db)).Scan(&dupCalls); err != nil {
		t.Fatal(err)
	}
	if dupCalls != 0 {
		t.Fatalf("%d calls have more than one receipt", dupCalls)
	}

	rep, err := query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Checked != int(total) {
		t.Fatalf("untouched database: checked %d (want %d), problems %v", rep.Checked, total, rep.Problems)
	}
	// Two chains, a checkpoint every 7 receipts of each: with more than
	// 2×6 receipts one chain cut a checkpoint, which reaches ClickHouse
	// right after its 7th receipt and verifies against its receipts.
	if total <= 2*6 {
		t.Fatalf("%d receipts: too few for a checkpoint to be certain", total)
	}
	for deadline := time.Now().Add(10 * time.Second); rep.Checkpoints == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d receipts in two chains and no verified checkpoint: %+v", total, rep)
		}
		time.Sleep(50 * time.Millisecond)
		if rep, err = query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil); err != nil || !rep.OK() {
			t.Fatalf("verify: %v %v", err, rep.Problems)
		}
	}

	// Tamper 1: rewrite one signed JSON (turn a deny into an allow).
	victim := ids["unknown tool"]
	if err := query.MutateAndWait(context.Background(), s.conn, s.db, query.TableReceipts,
		fmt.Sprintf(`UPDATE cloudevent = replaceOne(cloudevent, '"decision":"deny"', '"decision":"allow"') WHERE receipt_id = '%s'`, victim)); err != nil {
		t.Fatal(err)
	}
	rep, err = query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !names(rep.Problems, verify.ProblemBadSignature, victim) {
		t.Fatalf("edited cloudevent of %s not named: %v", victim, rep.Problems)
	}

	// Tamper 2: delete one row in the middle of its chain, away from the
	// edited one (a link next to it would be reported with it).
	var gone string
	var chain string
	var seq uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT receipt_id, chain_id, chain_seq FROM %[1]s.receipts WHERE chain_seq >= 2 AND receipt_id != '%[2]s'
		 AND (chain_id, toUInt64(chain_seq + 1)) IN (SELECT chain_id, chain_seq FROM %[1]s.receipts WHERE receipt_id != '%[2]s')
		 AND (chain_id, toUInt64(chain_seq - 1)) IN (SELECT chain_id, chain_seq FROM %[1]s.receipts WHERE receipt_id != '%[2]s')
		 ORDER BY chain_id, chain_seq LIMIT 1`, s.db, victim)).Scan(&gone, &chain, &seq); err != nil {
		t.Fatal(err)
	}
	if err := query.MutateAndWait(context.Background(), s.conn, s.db, query.TableReceipts, fmt.Sprintf("DELETE WHERE receipt_id = '%s'", gone)); err != nil {
		t.Fatal(err)
	}
	rep, err = query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range rep.Problems {
		if p.Kind == verify.ProblemChainGap && p.ChainID == chain && strings.HasPrefix(p.Detail, fmt.Sprintf("seq %d missing", seq)) && p.Seq == seq+1 {
			found = true
		}
	}
	if !found {
		t.Fatalf("deleted %s (chain %s seq %d) not reported as a gap: %v", gone, chain, seq, rep.Problems)
	}
}

func names(ps []verify.Problem, kind, id string) bool {
	for _, p := range ps {
		if p.Kind == kind && p.ReceiptID == id {
			return true
		}
	}
	return false
}

// TestMalformedCannotShadowARealCall: garbage sent first with a victim's
// tool_call_id must not take the victim's receipt, nor hide its decision.
func TestMalformedCannotShadowARealCall(t *testing.T) {
	s := newStack(t, stackOptions{})
	victim := newCall(t, "files", "list_directory", map[string]any{"path": "."})
	garbage := fmt.Sprintf(`{"tool_call_id":%q,"ep_id":"test-ep","phase":"pre","phase":"pre"}`, victim.ToolCallID)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// Without a Nats-Msg-Id, as an attacker would send it.
	if _, err := s.js.Publish(ctx, schemas.CallSubject("pre", "test-ep", "files"), []byte(garbage)); err != nil {
		t.Fatal(err)
	}
	s.waitRows(t, query.ViewReceipts, fmt.Sprintf("tool_call_id = '%s'", victim.ToolCallID), 1)
	d := s.call(t, victim)
	if d.Decision != "allow" {
		t.Fatalf("the real call got %s %v (receipt %s): shadowed by the malformed one", d.Decision, d.ReasonCodes, d.ReceiptID)
	}
	s.waitRows(t, query.ViewDecisions, fmt.Sprintf("tool_call_id = '%s'", victim.ToolCallID), 2)
	var allow uint64
	if err := s.conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.v_decisions WHERE tool_call_id = '%s' AND decision = 'allow'", s.db, victim.ToolCallID)).Scan(&allow); err != nil {
		t.Fatal(err)
	}
	if allow != 1 {
		t.Fatalf("v_decisions shows %d allows for the real call, want 1", allow)
	}
}

// TestPipelinePostPhase records what a read tool returned: the effect
// receipt carries the read document's hash and a UUIDv7 effect id.
func TestPipelinePostPhase(t *testing.T) {
	s := newStack(t, stackOptions{})
	pre := newCall(t, "files", "read_file", map[string]any{"path": "README.md"})
	started := time.Now()
	if d := s.call(t, pre); d.Decision != "allow" {
		t.Fatalf("pre: %s %v", d.Decision, d.ReasonCodes)
	}
	text := "# Talos\nsecret-free content\n"
	post, err := ep.PostOf(pre, map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}}, true, started, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d := s.call(t, post)
	if d.Decision != "allow" || d.Phase != "post" {
		t.Fatalf("post: %s %s %v", d.Phase, d.Decision, d.ReasonCodes)
	}
	ev, err := verify.VerifyEvent(d.Receipt, s.keys)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != schemas.TypeReceiptEffect || ev.Data.Effect == nil {
		t.Fatalf("effect receipt: type %s, effect %v", ev.Type, ev.Data.Effect)
	}
	hs := ev.Data.Effect.DocumentHashes
	if len(hs) != 1 || hs[0].Pointer != "/content/0/text" || hs[0].Hash != sha(text) || hs[0].SizeBytes != int64(len(text)) {
		t.Fatalf("document hashes %+v, want sha256 of the text at /content/0/text", hs)
	}
	if ev.Data.ResponseHash == "" || ev.Data.RequestHash == "" {
		t.Fatal("effect receipt should carry request and response hashes")
	}
	if strings.Contains(string(d.Receipt), "secret-free content") {
		t.Fatal("the receipt must carry hashes, never the result itself")
	}
	s.waitRows(t, query.ViewDecisions, fmt.Sprintf("tool_call_id = '%s'", pre.ToolCallID), 2)
}

// TestCheckpointAfterInterval: a chain whose receipts are fewer than
// Every cuts a checkpoint once its oldest uncovered receipt is Interval
// old, and the checkpoint verifies against them.
func TestCheckpointAfterInterval(t *testing.T) {
	s := newStack(t, stackOptions{checkpoints: &checkpoint.Options{Every: 1000, Interval: 300 * time.Millisecond}})
	for range 3 {
		s.call(t, newCall(t, "files", "read_file", map[string]any{"path": "a.txt"}))
	}
	s.waitRows(t, query.ViewDecisions, "1", 3)
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep, err := query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("verify: %v", rep.Problems)
		}
		if rep.Checked == 3 && rep.Uncovered == 0 && rep.Checkpoints >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint covers the receipts 300 ms after them: %+v", rep)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPipelineDevMode: an unclassified tool is allowed with a warning code.
func TestPipelineDevMode(t *testing.T) {
	s := newStack(t, stackOptions{mode: enforce.ModeDev})
	d := s.call(t, newCall(t, "files", "rm_rf", map[string]any{}))
	if d.Decision != "allow" || !slices.Equal(d.ReasonCodes, []string{schemas.CodeToolUnclassifiedAllowedDev}) {
		t.Fatalf("dev mode: %s %v", d.Decision, d.ReasonCodes)
	}
}

// TestPipelineDuplicateCallOneReceipt: the same call stored twice in
// TALOS_CALLS (as after a redelivery) gets the same decision and receipt,
// and the dropped duplicate leaves no gap in any chain.
func TestPipelineDuplicateCallOneReceipt(t *testing.T) {
	s := newStack(t, stackOptions{})
	sub, err := s.nc.SubscribeSync(schemas.DecisionSubjects("test-ep"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCall(t, "files", "list_directory", map[string]any{"path": "."})
	raw, _ := json.Marshal(c)
	s.call(t, c)
	// Publish the same envelope again without a Nats-Msg-Id, so the calls
	// stream keeps both copies and a worker sees the call a second time.
	if _, err := s.js.Publish(context.Background(), schemas.CallSubject("pre", "test-ep", "files"), raw); err != nil {
		t.Fatal(err)
	}
	var answers []schemas.Decision
	for len(answers) < 2 {
		m, err := sub.NextMsg(15 * time.Second)
		if err != nil {
			t.Fatalf("after %d answers: %v", len(answers), err)
		}
		var d schemas.Decision
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.ToolCallID == c.ToolCallID {
			answers = append(answers, d)
		}
	}
	if answers[0].ReceiptID != answers[1].ReceiptID || answers[0].Decision != answers[1].Decision {
		t.Fatalf("second delivery answered %s/%s, first %s/%s", answers[1].Decision, answers[1].ReceiptID, answers[0].Decision, answers[0].ReceiptID)
	}
	// More calls so both chains advance past the dropped duplicate.
	for i := 0; i < 6; i++ {
		s.call(t, newCall(t, "files", "list_directory", map[string]any{"path": fmt.Sprintf("dir-%d", i)}))
	}
	s.waitRows(t, query.ViewReceipts, "1", 7)
	var n uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf("SELECT uniqExact(receipt_id) FROM %s.receipts WHERE tool_call_id = '%s'", s.db, c.ToolCallID)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d receipts for one call, want 1", n)
	}
	rep, err := query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Checked != 7 {
		t.Fatalf("checked %d receipts (want 7); problems %v", rep.Checked, rep.Problems)
	}
}
