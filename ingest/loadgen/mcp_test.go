package loadgen

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/mcpup"
)

func msList(v ...float64) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * float64(time.Millisecond))
	}
	return d
}

func TestSummarize(t *testing.T) {
	oneToHundred := make([]float64, 100)
	for i := range oneToHundred {
		oneToHundred[i] = float64(i + 1)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(oneToHundred), func(i, j int) {
		oneToHundred[i], oneToHundred[j] = oneToHundred[j], oneToHundred[i]
	})
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want LatencySummary
	}{
		{"empty", nil, LatencySummary{}},
		{"one call", msList(5), LatencySummary{Calls: 1, P50ms: 5, P90ms: 5, P99ms: 5, MaxMs: 5, MeanMs: 5}},
		// index floor(p·(n−1)): p50 → 4, p90 → 8, p99 → 8.
		{"ten calls, unsorted", msList(10, 1, 9, 2, 8, 3, 7, 4, 6, 5),
			LatencySummary{Calls: 10, P50ms: 5, P90ms: 9, P99ms: 9, MaxMs: 10, MeanMs: 5.5}},
		{"a hundred calls, shuffled", msList(oneToHundred...),
			LatencySummary{Calls: 100, P50ms: 50, P90ms: 90, P99ms: 99, MaxMs: 100, MeanMs: 50.5}},
		{"sub-millisecond, mean rounded to µs", msList(0.25, 0.5, 0.75, 0.4),
			LatencySummary{Calls: 4, P50ms: 0.4, P90ms: 0.5, P99ms: 0.5, MaxMs: 0.75, MeanMs: 0.475}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summarize(tc.in); got != tc.want {
				t.Errorf("Summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAdded(t *testing.T) {
	for _, tc := range []struct {
		name        string
		direct, via []time.Duration
		want        AddedLatency
	}{
		{
			// Per round: 2, 1, 2, 6 → sorted 1, 2, 2, 6 (p50 index 1, p99 index 2).
			// Sides sorted: direct 1 2 3 4, via 3 3 5 10.
			name:   "via slower",
			direct: msList(1, 2, 3, 4), via: msList(3, 3, 5, 10),
			want: AddedLatency{PairedP50ms: 2, PairedP99ms: 2, P50ms: 1, P90ms: 2, P99ms: 2, MeanMs: 2.75},
		},
		{
			// A round where via was faster gives a negative difference.
			name:   "via faster in some rounds",
			direct: msList(4, 1, 1), via: msList(1, 2, 2),
			want: AddedLatency{PairedP50ms: 1, PairedP99ms: 1, P50ms: 1, P90ms: 1, P99ms: 1, MeanMs: -0.333},
		},
		{
			name:   "equal",
			direct: msList(1, 2, 3), via: msList(1, 2, 3),
			want: AddedLatency{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct, via := slices.Clone(tc.direct), slices.Clone(tc.via)
			if got := Added(direct, via); got != tc.want {
				t.Errorf("Added = %+v, want %+v", got, tc.want)
			}
			// The rounds must stay paired: Added must not sort its inputs.
			if !slices.Equal(direct, tc.direct) || !slices.Equal(via, tc.via) {
				t.Errorf("Added reordered its inputs: %v %v", direct, via)
			}
		})
	}
}

func TestResultDigest(t *testing.T) {
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	digest := func(r *mcp.CallToolResult) string {
		t.Helper()
		d, err := ResultDigest(r)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := digest(text("Echo: hello"))
	if b := digest(text("Echo: hello")); a != b {
		t.Errorf("equal results, different digests: %s, %s", a, b)
	}
	withMeta := text("Echo: hello")
	withMeta.Meta = mcp.Meta{"dev.talos/receipt_id": "r-1"}
	if b := digest(withMeta); a != b {
		t.Errorf("_meta must not count: %s, %s", a, b)
	}
	if b := digest(text("Echo: hellO")); a == b {
		t.Errorf("different text, same digest %s", a)
	}
	structured := text("Echo: hello")
	structured.StructuredContent = map[string]any{"n": 1}
	if b := digest(structured); a == b {
		t.Errorf("structured content ignored: %s", a)
	}
}

// ConnectMCP returns the sides connected before a failure, and closeAll
// closes them.
func TestConnectMCPCloseAll(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "direct", Version: "1"}, nil)
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer hs.Close()
	var specs [2]mcpup.Spec
	var err error
	if specs[0], err = mcpup.ParseSpec("direct=" + hs.URL); err != nil {
		t.Fatal(err)
	}
	if specs[1], err = mcpup.ParseSpec("via=/nonexistent/gateway"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sides, closeAll, err := ConnectMCP(ctx, specs, 10*time.Second, io.Discard)
	if err == nil || closeAll == nil || sides[0].CS == nil || sides[0].Name != "direct" || sides[1].CS != nil {
		t.Fatalf("ConnectMCP: %+v %v", sides, err)
	}
	if _, err := sides[0].CS.ListTools(ctx, nil); err != nil {
		t.Fatalf("the direct side before closeAll: %v", err)
	}
	closeAll()
	if _, err := sides[0].CS.ListTools(ctx, nil); err == nil {
		t.Fatal("the direct side still answers after closeAll")
	}
}
