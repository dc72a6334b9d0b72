package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce/redact/plant"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// propertyValuesPerFormat is how many fresh values of each format the
// pipeline property test sends.
const propertyValuesPerFormat = 1000

// leakWindow is the length, in characters, of the pieces of a secret the
// test looks for: any 12 characters of a value found anywhere is a leak.
const leakWindow = 12

// maxCallBytes bounds one call's arguments: cases are packed into calls
// up to about this size.
const maxCallBytes = 48 << 10

// sentCall is one call of the test: its cases and its outcome.
type sentCall struct {
	id      string
	cases   []plant.Case
	denied  bool   // sent to a tool the registry does not know
	argJSON []byte // the arguments as sent
	resJSON []byte // the result as sent
}

// TestRedactionPropertyPipeline sends 1,000 fresh values of every secret
// format of enforce/redact/plant through the real talosd, each value in
// every position a call has (top-level, nested and array arguments, an
// argument vector, free text, a shell command line, multi-line text, the
// result and the error message; some calls denied, whose arguments are
// recorded too), then searches every ClickHouse table and view, every
// stream and KV bucket but TALOS_CALLS, talosd's log and both formats of
// `talosctl export` for any 12 characters of any value: none may be
// found. A benign control corpus goes the same way and must come back
// intact (at most 1 % of its values changed), and `talosctl query
// secret-uses` must find the call of a value of each format.
func TestRedactionPropertyPipeline(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	// Once talosd is stopped (cleanups run last first), drop this test's
	// tables one by one, with time to spare: a few hundred megabytes of
	// rows take the database's own drop past its deadline on a busy machine.
	t.Cleanup(func() { dropTables(t, addr, db) })
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	g := []string{"--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db}
	genKeys(t, talosctl, dir, "worker")
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", filepath.Join(dir, "worker.key"), "--http-addr", "",
		"--capabilities", "optional", "--log-level", "debug")

	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TALOS_PROPERTY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with TALOS_PROPERTY_SEED=%d)", seed, seed)

	// Generate the cases and pack them into calls.
	type formatCases struct {
		name   string
		benign bool
		cases  []plant.Case
	}
	var all []formatCases
	for i, f := range plant.Formats() {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		fc := formatCases{name: f.Name}
		for k := 0; k < propertyValuesPerFormat; k++ {
			fc.cases = append(fc.cases, f.New(rng))
		}
		all = append(all, fc)
	}
	for i, f := range plant.Benign() {
		rng := rand.New(rand.NewPCG(seed, 1000+uint64(i)))
		fc := formatCases{name: f.Name, benign: true}
		for k := 0; k < propertyValuesPerFormat; k++ {
			fc.cases = append(fc.cases, f.New(rng))
		}
		all = append(all, fc)
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	// A probe per format: its first value alone in a call, sent first, so
	// the lookup below asks about a call of a small table (secret-uses
	// reads every row of v_tool_calls).
	var probes, calls []*sentCall
	for _, fc := range all {
		start := 0
		if !fc.benign && fc.cases[0].Lookup != "" {
			probes = append(probes, &sentCall{cases: fc.cases[:1]})
			start = 1
		}
		for k := start; k < len(fc.cases); {
			c := &sentCall{}
			for k < len(fc.cases) && len(c.cases) < 16 {
				c.cases = append(c.cases, fc.cases[k])
				k++
				b, _ := json.Marshal(plant.Args(rng, c.cases...))
				if len(b) > maxCallBytes {
					break
				}
			}
			c.denied = len(calls)%10 == 9
			calls = append(calls, c)
		}
	}

	// Send them: pre, then (for allowed calls) post with the result and
	// an error message.
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ep.NewClient(nc, js, "redaction-property")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	conn := openClickHouse(t, ctx, addr, db)

	// The probes, then the investigator's question for each: which calls
	// used this value? `talosctl query secret-uses` must name the probe.
	sendAll(t, ctx, client, seed, probes)
	waitCalls(t, ctx, conn, db, len(probes), 5*time.Minute)
	key := filepath.Join(dir, "talos-data", "keys", "redaction.key")
	for _, c := range probes {
		v := c.cases[0].Lookup
		out, code := run(t, talosctl, append(clone(g), "query", "secret-uses", "--redaction-key", key, "--value="+v)...)
		if code != 0 || !strings.Contains(out, c.id) {
			t.Errorf("secret-uses for a %s value: exit %d, want call %s\n%s", c.cases[0].Format, code, c.id, out)
		}
		if strings.Contains(out, v) {
			t.Errorf("secret-uses printed a %s value", c.cases[0].Format)
		}
	}
	if len(probes) < 20 {
		t.Errorf("pseudonym lookup asked about only %d formats", len(probes))
	}

	// The bulk.
	sendAll(t, ctx, client, seed, calls)
	calls = append(probes, calls...)
	waitCalls(t, ctx, conn, db, len(calls), 5*time.Minute)

	// Every place a value could end up.
	haystacks, tables := atRest(t, ctx, conn, db, js)
	for _, format := range []string{"jsonl", "csv"} {
		file := filepath.Join(dir, "export."+format)
		if out, code := run(t, talosctl, append(clone(g), "export", "--format", format, "--kind", "all", "--out", file)...); code != 0 {
			t.Fatalf("export %s: exit %d\n%s", format, code, out)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		haystacks = append(haystacks, haystack{"export " + format, b})
	}
	haystacks = append(haystacks, talosdLog(t, dir))
	if tables < 6 || len(haystacks) < tables+4 {
		t.Fatalf("searched only %d places (%d tables)", len(haystacks), tables)
	}
	// The searches are not vacuous: the calls are where they must be.
	for _, h := range haystacks {
		if h.where == "clickhouse tool_calls" || h.where == "clickhouse artifacts" || h.where == "stream "+schemas.StreamAudit || strings.HasPrefix(h.where, "export ") {
			if !bytes.Contains(h.data, []byte(calls[0].id)) && h.where != "clickhouse artifacts" {
				t.Fatalf("%s does not hold call %s: the search would be vacuous", h.where, calls[0].id)
			}
			if len(h.data) < 100*len(calls) {
				t.Fatalf("%s holds only %d bytes for %d calls", h.where, len(h.data), len(calls))
			}
		}
	}

	// Leaks: any 12 characters of any secret, in any place.
	idx := newLeakIndex()
	owner := map[int]string{} // secret number -> format
	n := 0
	for _, fc := range all {
		if fc.benign {
			continue
		}
		for _, c := range fc.cases {
			idx.add(c.Secret, n)
			owner[n] = fc.name
			n++
		}
	}
	// The search finds what it must: a piece of a value, escaped as JSON
	// writes it, in the middle of a stored row.
	probe := ""
	for _, c := range all[0].cases {
		if len([]rune(c.Secret)) >= 20 {
			probe = c.Secret
			break
		}
	}
	canary := []byte(`{"x":"` + jsonBody(probe)[2:] + `"}`)
	if got := idx.search(canary); len(got) != 1 {
		t.Fatalf("the leak search does not find a piece of a value: %v", got)
	}
	leaks := map[string]map[string]int{} // format -> place -> values leaked
	example := ""
	for _, h := range haystacks {
		for secret, at := range idx.search(h.data) {
			f := owner[secret]
			if leaks[f] == nil {
				leaks[f] = map[string]int{}
			}
			leaks[f][h.where]++
			if example == "" {
				lo, hi := max(0, at-80), min(len(h.data), at+80)
				example = fmt.Sprintf("%s in %s: …%q…", f, h.where, h.data[lo:hi])
			}
		}
	}

	// The control corpus: every benign value is stored as many times as
	// it was sent (in the arguments and the result artifacts).
	stored := artifactsByCall(t, ctx, conn, db)
	lost, total := 0, 0
	var lostEx []string
	for _, c := range calls {
		if len(c.cases) == 0 || !strings.HasPrefix(c.cases[0].Format, "benign") {
			continue
		}
		art := stored[c.id]
		for _, bc := range c.cases {
			total++
			body := jsonBody(bc.Secret)
			want := strings.Count(string(c.argJSON), body)
			if !c.denied {
				want += strings.Count(string(c.resJSON), body)
			}
			if got := strings.Count(art, body); got < want {
				lost++
				if len(lostEx) < 5 {
					lostEx = append(lostEx, fmt.Sprintf("%s %q (%d of %d copies)", bc.Format, bc.Secret, got, want))
				}
			}
		}
	}

	// The report: per format, values leaked into each kind of place.
	places := make([]string, 0, len(haystacks))
	for _, h := range haystacks {
		places = append(places, h.where)
	}
	sort.Strings(places)
	groups := []struct{ name, prefix string }{
		{"tables", "clickhouse "}, {"views", "clickhouse v_"}, {"streams", "stream "}, {"exports", "export "}, {"log", "talosd log"},
	}
	groupOf := func(place string) string {
		g := ""
		for _, gr := range groups {
			if strings.HasPrefix(place, gr.prefix) {
				g = gr.name // the longest prefix wins (views over tables)
			}
		}
		return g
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-32s %6s %5s", "format", "values", "calls")
	for _, gr := range groups {
		fmt.Fprintf(&sb, " %7s", gr.name)
	}
	sb.WriteString("\n")
	callsOf := map[string]int{}
	for _, c := range calls {
		if len(c.cases) > 0 {
			callsOf[c.cases[0].Format]++
		}
	}
	for _, fc := range all {
		if fc.benign {
			continue
		}
		byGroup := map[string]int{}
		for p, v := range leaks[fc.name] {
			byGroup[groupOf(p)] += v
		}
		fmt.Fprintf(&sb, "%-32s %6d %5d", fc.name, len(fc.cases), callsOf[fc.name])
		for _, gr := range groups {
			fmt.Fprintf(&sb, " %7d", byGroup[gr.name])
		}
		sb.WriteString("\n")
		for _, p := range places {
			if v := leaks[fc.name][p]; v > 0 {
				t.Errorf("%s: %d values leaked into %s", fc.name, v, p)
			}
		}
	}
	fmt.Fprintf(&sb, "places searched (%d): %s\n", len(places), strings.Join(places, ", "))
	rate := float64(lost) / float64(max(total, 1))
	fmt.Fprintf(&sb, "benign control corpus: %d of %d values changed (%.2f %%)\n", lost, total, 100*rate)
	t.Log(sb.String())
	if example != "" {
		t.Errorf("first leak: %s", example)
	}
	if total < 5*propertyValuesPerFormat || rate > 0.01 {
		t.Errorf("over-redaction %.2f %% of %d benign values (at most 1 %%): %v", 100*rate, total, lostEx)
	}

}

// sendAll sends the calls, eight at a time.
func sendAll(t *testing.T, ctx context.Context, client *ep.Client, seed uint64, calls []*sentCall) {
	t.Helper()
	var wg sync.WaitGroup
	work := make(chan *sentCall)
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				if err := sendCase(ctx, client, rng2(seed, c), c); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for _, c := range calls {
		work <- c
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// dropTables drops the views and tables of the test database.
func dropTables(t *testing.T, addr, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Logf("drop tables: %v", err)
		return
	}
	defer conn.Close()
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT name FROM system.tables WHERE database = '%s' ORDER BY engine = 'View' DESC", db))
	if err != nil {
		t.Logf("drop tables: %v", err)
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		if err := conn.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS `%s`.`%s`", db, n)); err != nil {
			t.Logf("drop table %s: %v", n, err)
		}
	}
}

// waitCalls waits until v_tool_calls holds n calls, failing the test if
// it does not within d.
func waitCalls(t *testing.T, ctx context.Context, conn driver.Conn, db string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var got uint64
		_ = conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.%s", db, query.ViewToolCalls)).Scan(&got)
		if got >= uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tool_calls rows, want %d", got, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// rng2 is the random source of one call's free-text filler.
func rng2(seed uint64, c *sentCall) *rand.Rand {
	h := uint64(len(c.cases))
	for _, x := range c.cases[0].Secret {
		h = h*31 + uint64(x)
	}
	return rand.New(rand.NewPCG(seed, h))
}

// sendCase sends one call: phase pre, then phase post with the result and
// an error message, unless the pre decision denied it.
func sendCase(ctx context.Context, client *ep.Client, rng *rand.Rand, c *sentCall) error {
	tool := "list-prs"
	if c.denied {
		tool = "delete-everything" // not in the registry: denied, arguments recorded
	}
	args := plant.Args(rng, c.cases...)
	call, err := ep.NewCall(client.EPID(), "github", tool, args)
	if err != nil {
		return err
	}
	c.id = call.ToolCallID
	c.argJSON = reencode(call.Request.Arguments)
	dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	d, err := client.Call(dctx, call)
	if err != nil {
		return fmt.Errorf("pre %s: %w", c.cases[0].Format, err)
	}
	if d.Decision != schemas.DecisionAllow {
		if !c.denied {
			return fmt.Errorf("pre %s: %s %v", c.cases[0].Format, d.Decision, d.ReasonCodes)
		}
		return nil
	}
	if c.denied {
		return fmt.Errorf("a call to an unknown tool was allowed")
	}
	started := time.Now()
	post, err := ep.PostOf(call, plant.Result(c.cases...), false, started, time.Now())
	if err != nil {
		return err
	}
	c.resJSON = reencode(post.Result)
	post.Error = &schemas.CallError{Code: "TOOL_ERROR", Kind: "tool", Message: plant.ErrorMessage(c.cases...)}
	if _, err := client.Call(dctx, post); err != nil {
		return fmt.Errorf("post %s: %w", c.cases[0].Format, err)
	}
	return nil
}

// artifactsByCall returns, per tool_call_id, the stored arguments and
// result artifacts, concatenated.
func artifactsByCall(t *testing.T, ctx context.Context, conn driver.Conn, db string) map[string]string {
	t.Helper()
	content := map[string]string{}
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT ref, content FROM `%s`.artifacts", db))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ref, c string
		if err := rows.Scan(&ref, &c); err != nil {
			t.Fatal(err)
		}
		content[ref] = c
	}
	rows.Close()
	out := map[string]string{}
	rows, err = conn.Query(ctx, fmt.Sprintf("SELECT tool_call_id, args_ref, result_ref FROM `%s`.tool_calls", db))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, args, res string
		if err := rows.Scan(&id, &args, &res); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[id]; !dup {
			out[id] = content[args] + "\n" + content[res]
		}
	}
	return out
}

// leakIndex finds pieces of many secrets in large texts at once: every
// run of leakWindow characters of each secret, as written and as JSON
// writes it, keyed by its first 8 bytes. A bit table of those keys'
// hashes lets the search skip almost every offset of a text without a map
// lookup.
type leakIndex struct {
	byPrefix map[uint64][]leakPiece
	bits     []uint64
}

type leakPiece struct {
	piece  string
	secret int
}

const leakHashBits = 24

func newLeakIndex() *leakIndex {
	return &leakIndex{byPrefix: map[uint64][]leakPiece{}, bits: make([]uint64, 1<<leakHashBits/64)}
}

// prefixKey reads 8 bytes as a number; prefixHash spreads it over the
// bit table.
func prefixKey(s string) uint64 {
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func prefixHash(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> (64 - leakHashBits) }

func (x *leakIndex) add(secret string, id int) {
	for _, w := range plant.Windows(secret, leakWindow) {
		if len(w) < 8 {
			continue
		}
		k := prefixKey(w)
		h := prefixHash(k)
		x.bits[h/64] |= 1 << (h % 64)
		x.byPrefix[k] = append(x.byPrefix[k], leakPiece{piece: w, secret: id})
	}
}

// search returns the secrets found in data and where the first piece of
// each begins.
func (x *leakIndex) search(data []byte) map[int]int {
	found := map[int]int{}
	for i := 0; i+8 <= len(data); i++ {
		k := uint64(data[i]) | uint64(data[i+1])<<8 | uint64(data[i+2])<<16 | uint64(data[i+3])<<24 |
			uint64(data[i+4])<<32 | uint64(data[i+5])<<40 | uint64(data[i+6])<<48 | uint64(data[i+7])<<56
		h := prefixHash(k)
		if x.bits[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		for _, p := range x.byPrefix[k] {
			if _, seen := found[p.secret]; !seen && bytes.HasPrefix(data[i:], []byte(p.piece)) {
				found[p.secret] = i
			}
		}
	}
	return found
}

// reencode writes JSON again without escaping <, > and &, as the stored
// (canonical) artifacts do.
func reencode(b []byte) []byte {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return buf.Bytes()
}

// jsonBody is s as it appears inside a JSON string.
func jsonBody(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b := strings.TrimSuffix(buf.String(), "\n")
	return b[1 : len(b)-1]
}
