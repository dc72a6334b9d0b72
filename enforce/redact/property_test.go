package redact_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/enforce/redact/plant"
	"github.com/talos-audit/talos/schemas"
)

// propertyValues is how many fresh values of each format the property
// tests generate.
const propertyValues = 1000

// windowBytes is the length of the pieces of a secret looked for: any
// 12 characters of it in the output is a (partial) leak.
const windowBytes = 12

// callCases is how many values share one call.
const callCases = 4

// propertySeed is the seed of this run: fresh each run, printed, and
// replayable with TALOS_PROPERTY_SEED.
func propertySeed(t *testing.T) uint64 {
	if s := os.Getenv("TALOS_PROPERTY_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TALOS_PROPERTY_SEED: %v", err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// positions are where plant puts a case, as the top-level members (or
// roots) of the redacted documents they end up under.
var positions = []struct {
	name  string
	match func(ptr string) bool
}{
	{"args top level", func(p string) bool {
		return hasAnyPrefix(p, "/args/input_", "/args/") && !hasAnyPrefix(p, otherArgs...)
	}},
	{"args nested", func(p string) bool { return strings.HasPrefix(p, "/args/config/") }},
	{"args array", func(p string) bool { return hasAnyPrefix(p, "/args/items_", "/args/accounts_") }},
	{"args argv", func(p string) bool { return strings.HasPrefix(p, "/args/argv_") }},
	{"args free text", func(p string) bool { return strings.HasPrefix(p, "/args/notes_") }},
	{"args shell command", func(p string) bool { return strings.HasPrefix(p, "/args/command_") }},
	{"args multi-line", func(p string) bool { return strings.HasPrefix(p, "/args/script_") }},
	{"result", func(p string) bool { return strings.HasPrefix(p, "/result") }},
	{"error message", func(p string) bool { return p == "/error/message" }},
}

var otherArgs = []string{"/args/config/", "/args/items_", "/args/accounts_", "/args/argv_", "/args/notes_", "/args/command_", "/args/script_", "/args/repo"}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// leaf is one redacted string of a document, with its pointer.
type leaf struct{ ptr, json string }

// leaves flattens a redacted document to its pointers and their values as
// JSON writes them (as stored).
func leaves(v any, ptr string, out []leaf) []leaf {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			out = leaves(e, ptr+"/"+strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1"), out)
			out = append(out, leaf{ptr: ptr + "/" + k, json: jsonOf(k)})
		}
	case []any:
		for i, e := range t {
			out = leaves(e, ptr+"/"+strconv.Itoa(i), out)
		}
	default:
		out = append(out, leaf{ptr: ptr, json: jsonOf(t)})
	}
	return out
}

func jsonOf(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	b, _ := json.Marshal(v) // also the HTML-escaping form
	return buf.String() + string(b)
}

// viaWire round-trips v through JSON as the worker receives it.
func viaWire(t testing.TB, v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// redactCall redacts the arguments, result and error message of a call
// holding the cases, as the worker does, and returns the leaves before and
// after and the findings.
func redactCall(t testing.TB, r *redact.Redactor, rng *rand.Rand, cs ...plant.Case) (in, stored []leaf, found []schemas.Redaction) {
	for _, p := range []struct {
		base string
		doc  any
	}{
		{"/args", plant.Args(rng, cs...)},
		{"/result", plant.Result(cs...)},
		{"/error/message", plant.ErrorMessage(cs...)},
	} {
		doc := viaWire(t, p.doc)
		out, f, err := r.Redact(doc, p.base)
		if err != nil {
			t.Fatalf("%s: Redact: %v", cs[0].Format, err)
		}
		in = leaves(doc, p.base, in)
		stored = leaves(out, p.base, stored)
		found = append(found, f...)
	}
	return in, stored, found
}

// TestRedactionProperty generates 1,000 fresh values of every secret
// format, places each in every position a call has (four values to a
// call), redacts as the worker does, and requires that no 12-character
// piece of any value survives
// anywhere and that the findings carry each value's pseudonym in every
// position (so `talosctl query secret-uses` finds it). It then places
// 1,000 values of each benign control format the same way and requires
// that at most 1 % of them lose anything. The table of both is logged.
func TestRedactionProperty(t *testing.T) {
	seed := propertySeed(t)
	t.Logf("seed %d (replay with TALOS_PROPERTY_SEED=%d)", seed, seed)
	key := sha256.Sum256([]byte("talos property test"))
	r, err := redact.New(redact.Config{Key: key[:]})
	if err != nil {
		t.Fatal(err)
	}

	type tally struct {
		values              int
		leaks, lookupMisses map[string]int
		leakEx, lookupEx    string
	}
	formats := plant.Formats()
	results := make([]tally, len(formats))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for fi, f := range formats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rng := rand.New(rand.NewPCG(seed, uint64(fi)))
			tl := tally{leaks: map[string]int{}, lookupMisses: map[string]int{}}
			// Four values to a call, so that values meet in the same
			// text (the result, the error message) as they do in a batch.
			var batch []plant.Case
			var stored []leaf
			var found []schemas.Redaction
			for i := 0; i < propertyValues; i++ {
				if i%callCases == 0 {
					batch = batch[:0]
					for k := 0; k < callCases; k++ {
						batch = append(batch, f.New(rng))
					}
					_, stored, found = redactCall(t, r, rng, batch...)
				}
				c := batch[i%callCases]
				tl.values++
				wins := plant.Windows(c.Secret, windowBytes)
				for _, pos := range positions {
					leaked := false
					for _, l := range stored {
						if !pos.match(l.ptr) {
							continue
						}
						for _, w := range wins {
							if strings.Contains(l.json, w) {
								leaked = true
								if tl.leakEx == "" {
									tl.leakEx = fmt.Sprintf("value %q at %s: %.300s", c.Secret, l.ptr, l.json)
								}
								break
							}
						}
						if leaked {
							break
						}
					}
					if leaked {
						tl.leaks[pos.name]++
					}
				}
				if c.Lookup == "" {
					continue
				}
				want := r.Pseudonym(c.Lookup)
				for _, pos := range positions {
					if pos.name == "args argv" && c.Argv == nil {
						continue
					}
					ok := false
					for _, fd := range found {
						if fd.Pseudonym == want && pos.match(fd.Pointer) {
							ok = true
							break
						}
					}
					if !ok {
						tl.lookupMisses[pos.name]++
						if tl.lookupEx == "" {
							tl.lookupEx = fmt.Sprintf("no finding with the pseudonym of %q at %s; it was in %q", c.Lookup, pos.name, c.Text)
						}
					}
				}
			}
			results[fi] = tl
		}()
	}
	wg.Wait()

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-34s %7s", "format", "values")
	for _, pos := range positions {
		fmt.Fprintf(&sb, " %9s", shortPos(pos.name))
	}
	sb.WriteString("  lookup-misses\n")
	for fi, f := range formats {
		tl := results[fi]
		fmt.Fprintf(&sb, "%-34s %7d", f.Name, tl.values)
		misses := 0
		for _, pos := range positions {
			fmt.Fprintf(&sb, " %9d", tl.leaks[pos.name])
			misses += tl.lookupMisses[pos.name]
		}
		fmt.Fprintf(&sb, "  %d\n", misses)
		if tl.values < propertyValues {
			t.Errorf("%s: only %d values", f.Name, tl.values)
		}
		for _, pos := range positions {
			if tl.leaks[pos.name] > 0 {
				t.Errorf("%s: %d of %d values leaked in %s; first: %s", f.Name, tl.leaks[pos.name], tl.values, pos.name, tl.leakEx)
			}
			if tl.lookupMisses[pos.name] > 0 {
				t.Errorf("%s: the pseudonym of %d of %d values is missing from %s; first: %s", f.Name, tl.lookupMisses[pos.name], tl.values, pos.name, tl.lookupEx)
			}
		}
	}
	t.Log(sb.String())

	// The control corpus: benign values in the same positions.
	lost, total := 0, 0
	var lostBy []string
	var bt strings.Builder
	for bi, f := range plant.Benign() {
		rng := rand.New(rand.NewPCG(seed, 1000+uint64(bi)))
		n := 0
		for i := 0; i < propertyValues; i += callCases {
			var batch []plant.Case
			for k := 0; k < callCases; k++ {
				batch = append(batch, f.New(rng))
			}
			in, stored, _ := redactCall(t, r, rng, batch...)
			for _, c := range batch {
				total++
				if count(stored, c.Secret) < count(in, c.Secret) {
					n++
					if len(lostBy) < 5 {
						lostBy = append(lostBy, fmt.Sprintf("%s %q", c.Format, c.Secret))
					}
				}
			}
		}
		lost += n
		fmt.Fprintf(&bt, "%-22s %5d values, %3d over-redacted\n", f.Name, propertyValues, n)
	}
	rate := float64(lost) / float64(total)
	t.Logf("benign control corpus: %d of %d values lost something (%.2f %%)\n%s", lost, total, 100*rate, bt.String())
	if total < 5*propertyValues || rate > 0.01 {
		t.Errorf("over-redaction %.2f %% of %d benign values (at most 1 %%); e.g. %v", 100*rate, total, lostBy)
	}
}

// count counts the copies of a value in the leaves.
func count(ls []leaf, v string) int {
	body := jsonBody(v)
	n := 0
	for _, l := range ls {
		n += strings.Count(l.json, body)
	}
	return n
}

func jsonBody(s string) string {
	b := jsonOf(s)
	b = b[:strings.IndexByte(b, '\n')]
	return b[1 : len(b)-1]
}

func shortPos(name string) string {
	name = strings.TrimPrefix(name, "args ")
	if len(name) > 9 {
		name = name[:9]
	}
	return name
}
