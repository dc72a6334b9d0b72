package loadgen

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
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
	sides, closeAll, err := ConnectMCP(ctx, specs, 10*time.Second, io.Discard, nil)
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

// A streamable HTTP via side is reached over TLS trusting only the CA
// given, with the bearer token on every request, and the direct side is
// never sent the token.
func TestConnectMCPViaHTTPS(t *testing.T) {
	const token = "s3cret-token"
	srv := mcp.NewServer(&mcp.Implementation{Name: "gw", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
		Message string `json:"message"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "Echo: " + in.Message}}}, nil, nil
	})
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var requests, directAuth atomic.Int64
	via := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	via.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake of "CA not given"
	via.StartTLS()
	defer via.Close()
	direct := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			directAuth.Add(1)
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	defer direct.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: via.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	specs := [2]mcpup.Spec{{ServerID: "direct", URL: direct.URL}, {ServerID: "gw", URL: via.URL}}
	connect := func(t *testing.T, caFile, tok string) ([2]MCPSide, func(), error) {
		t.Helper()
		c, err := HTTPClient(caFile, tok)
		if err != nil {
			t.Fatalf("HTTPClient: %v", err)
		}
		return ConnectMCP(context.Background(), specs, 10*time.Second, io.Discard, c)
	}

	t.Run("trusted CA and token", func(t *testing.T) {
		sides, closeAll, err := connect(t, ca, token)
		defer closeAll()
		if err != nil {
			t.Fatalf("ConnectMCP: %v", err)
		}
		d, v, err := CompareMCP(context.Background(), sides[0], sides[1],
			NewMCPOp("echo", "", "", map[string]any{"message": "hi"}), 3, 1, 10*time.Second)
		if err != nil || len(d) != 3 || len(v) != 3 {
			t.Fatalf("CompareMCP: %d, %d rounds, %v", len(d), len(v), err)
		}
		if requests.Load() == 0 || directAuth.Load() != 0 {
			t.Errorf("via served %d requests, direct got %d with an Authorization header; want > 0 and 0",
				requests.Load(), directAuth.Load())
		}
	})
	for _, tc := range []struct{ name, ca, token, want string }{
		{"wrong token", ca, "other", "Unauthorized"},
		{"no token", ca, "", "Unauthorized"},
		{"CA not given", "", token, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sides, closeAll, err := connect(t, tc.ca, tc.token)
			defer closeAll()
			if err == nil || sides[1].CS != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ConnectMCP = %v, want an error mentioning %q and no via session", err, tc.want)
			}
		})
	}
}

func TestHTTPClientBadCA(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]string{"missing": filepath.Join(dir, "none.pem"), "not PEM": notPEM} {
		if _, err := HTTPClient(f, "tok"); err == nil || strings.Contains(err.Error(), "tok") {
			t.Errorf("%s: HTTPClient = %v, want an error that does not repeat the token", name, err)
		}
	}
}
