package loadgen

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/mcpup"
)

// LatencySummary describes one sample of call latencies, in milliseconds.
// Percentiles are nearest-rank from below: the value at index
// floor(p·(n−1)) of the sorted sample, as in talosctl bench.
type LatencySummary struct {
	Calls  int     `json:"calls"`
	P50ms  float64 `json:"p50_ms"`
	P90ms  float64 `json:"p90_ms"`
	P99ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// AddedLatency is what the via side adds to the direct side, in
// milliseconds, two ways: Paired* are percentiles of the per-round
// differences (via − direct of the same round), and the others are
// differences of the two sides' percentiles.
type AddedLatency struct {
	PairedP50ms float64 `json:"paired_p50_ms"`
	PairedP99ms float64 `json:"paired_p99_ms"`
	P50ms       float64 `json:"p50_ms"`
	P90ms       float64 `json:"p90_ms"`
	P99ms       float64 `json:"p99_ms"`
	MeanMs      float64 `json:"mean_ms"`
}

// MCPResult is a bench-mcp run, as talosctl bench-mcp --json prints it.
type MCPResult struct {
	Tool   string         `json:"tool"`
	Warmup int            `json:"warmup"`
	Direct string         `json:"direct"`
	Via    string         `json:"via"`
	D      LatencySummary `json:"direct_latency"`
	V      LatencySummary `json:"via_latency"`
	Added  AddedLatency   `json:"added"`
}

// Summarize sorts d in place and describes it; an empty sample is all zeros.
func Summarize(d []time.Duration) LatencySummary {
	if len(d) == 0 {
		return LatencySummary{}
	}
	slices.Sort(d)
	at := func(p float64) float64 { return ms(d[int(p*float64(len(d)-1))]) }
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return LatencySummary{
		Calls: len(d), P50ms: at(0.50), P90ms: at(0.90), P99ms: at(0.99), MaxMs: at(1),
		MeanMs: roundMs(ms(sum) / float64(len(d))),
	}
}

// Added compares two samples taken in rounds: direct[i] and via[i] are the
// same round. Neither slice is modified.
func Added(direct, via []time.Duration) AddedLatency {
	n := min(len(direct), len(via))
	diff := make([]time.Duration, n)
	for i := range n {
		diff[i] = via[i] - direct[i]
	}
	pd := Summarize(diff)
	ds, vs := Summarize(slices.Clone(direct)), Summarize(slices.Clone(via))
	return AddedLatency{
		PairedP50ms: pd.P50ms, PairedP99ms: pd.P99ms,
		P50ms: roundMs(vs.P50ms - ds.P50ms), P90ms: roundMs(vs.P90ms - ds.P90ms), P99ms: roundMs(vs.P99ms - ds.P99ms),
		MeanMs: roundMs(vs.MeanMs - ds.MeanMs),
	}
}

// roundMs rounds milliseconds to whole microseconds, the resolution of every
// figure here.
func roundMs(msec float64) float64 { return math.Round(msec*1000) / 1000 }

// MCPSide is one end of the comparison: a connected client session, named
// in errors by Name.
type MCPSide struct {
	Name string
	CS   *mcp.ClientSession
}

// MCPOp is the request a bench-mcp run measures: its name for reports
// and errors (a tool's name, or "prompts/get NAME", "resources/read URI"), and Do, which sends it on a session and returns a short
// digest of what came back (to compare the two sides).
type MCPOp struct {
	Name string
	Do   func(ctx context.Context, cs *mcp.ClientSession) (string, error)
}

// NewMCPOp is the request of bench-mcp's flags: prompts/get of prompt
// (with args) when prompt is set, resources/read of resource when that is
// set, else tools/call of tool with args. A protocol error (a gateway's
// deny among them) or a tool result with isError fails the run.
func NewMCPOp(tool, prompt, resource string, args map[string]any) MCPOp {
	switch {
	case prompt != "":
		pargs := map[string]string{}
		for k, v := range args {
			pargs[k] = fmt.Sprint(v)
		}
		return MCPOp{Name: "prompts/get " + prompt, Do: func(ctx context.Context, cs *mcp.ClientSession) (string, error) {
			res, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: prompt, Arguments: pargs})
			if err != nil {
				return "", fmt.Errorf("prompts/get %s: %w", prompt, err)
			}
			return digestJSON(res.Messages)
		}}
	case resource != "":
		return MCPOp{Name: "resources/read " + resource, Do: func(ctx context.Context, cs *mcp.ClientSession) (string, error) {
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: resource})
			if err != nil {
				return "", fmt.Errorf("resources/read %s: %w", resource, err)
			}
			return digestJSON(res.Contents)
		}}
	}
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	return MCPOp{Name: tool, Do: func(ctx context.Context, cs *mcp.ClientSession) (string, error) {
		res, err := cs.CallTool(ctx, p)
		if err != nil {
			return "", fmt.Errorf("tools/call %s: %w", tool, err)
		}
		if res.IsError {
			return "", fmt.Errorf("tools/call %s: the result is a tool error (isError)", tool)
		}
		return ResultDigest(res)
	}}
}

// CompareMCP sends op on the direct side and then the via side, round
// after round, one request in flight: warmup rounds checked but not timed,
// then calls timed rounds. Every request must succeed and both sides must
// return the same result. It returns each side's latencies, round by
// round.
func CompareMCP(ctx context.Context, direct, via MCPSide, op MCPOp, calls, warmup int, timeout time.Duration) (d, v []time.Duration, err error) {
	sides := [2]MCPSide{direct, via}
	lat := [2][]time.Duration{make([]time.Duration, 0, calls), make([]time.Duration, 0, calls)}
	for round := -warmup; round < calls; round++ {
		var digests [2]string
		for i, s := range sides {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			start := time.Now()
			digest, err := op.Do(cctx, s.CS) // its errors name the request
			took := time.Since(start)
			cancel()
			if err != nil {
				return nil, nil, fmt.Errorf("round %d: %s: %w", round+warmup+1, s.Name, err)
			}
			if round >= 0 {
				lat[i] = append(lat[i], took)
			}
			digests[i] = digest
		}
		if digests[0] != digests[1] {
			return nil, nil, fmt.Errorf("round %d: the results differ: %s returned %s, %s returned %s",
				round+warmup+1, direct.Name, digests[0], via.Name, digests[1])
		}
	}
	return lat[0], lat[1], nil
}

// ResultDigest is a short digest of what a result says (content and
// structured content; _meta is left out), to compare the two sides without
// printing what the tool returned.
func ResultDigest(r *mcp.CallToolResult) (string, error) {
	return digestJSON(struct {
		Content    []mcp.Content `json:"content"`
		Structured any           `json:"structuredContent,omitempty"`
	}{r.Content, r.StructuredContent})
}

// digestJSON is the size and a short sha256 of v's JSON.
func digestJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(sum[:6])), nil
}

// ConnectMCP connects to the two sides of a comparison, direct first, each
// start and handshake bounded by timeout; stdio servers' stderr goes to
// stderr. A streamable HTTP via side is reached with viaHTTP (nil: Go's
// default client), so that its token and trusted CA are sent to the via
// side only. closeAll closes the sessions connected (closing a stdio
// session ends its server; a gateway then drains the post events it still
// holds); it is set also on error, for the caller to call.
func ConnectMCP(ctx context.Context, specs [2]mcpup.Spec, timeout time.Duration, stderr io.Writer, viaHTTP *http.Client) (sides [2]MCPSide, closeAll func(), err error) {
	closeAll = func() {
		for _, s := range sides {
			if s.CS != nil {
				_ = s.CS.Close()
			}
		}
	}
	for i, s := range specs {
		opts := []mcpup.Option{mcpup.WithStderr(stderr)}
		if i == 1 && viaHTTP != nil {
			opts = append(opts, mcpup.WithHTTPClient(viaHTTP))
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		cs, err := mcpup.Connect(cctx, s, &mcp.Implementation{Name: "talosctl-bench-mcp", Version: "dev"}, opts...)
		cancel()
		if err != nil {
			return sides, closeAll, err
		}
		sides[i] = MCPSide{Name: s.ServerID, CS: cs}
	}
	return sides, closeAll, nil
}

// HTTPClient is the client of a streamable HTTP side (a gateway's /mcp):
// it trusts only the certificates in caFile (PEM; "" trusts the system's
// roots) and sends token, unless "", as "Authorization: Bearer <token>"
// on every request. Errors name the file, never the token.
func HTTPClient(caFile, token string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	if token == "" {
		return &http.Client{Transport: tr}, nil
	}
	return &http.Client{Transport: &bearer{token: token, next: tr}}, nil
}

// bearer adds an Authorization header to every request it sends on.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not modify the request it is given
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// ParseCallArgs reads a tools/call's arguments: exactly one JSON object,
// numbers kept as written (json.Number).
func ParseCallArgs(s string) (map[string]any, error) {
	var args map[string]any
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil || args == nil || dec.More() {
		return nil, errors.New("not one JSON object")
	}
	return args, nil
}

// NewMCPResult summarises a comparison of tool between the direct and via
// specs: each side's latencies (sorted in place) and what via adds.
func NewMCPResult(tool string, warmup int, specs [2]mcpup.Spec, direct, via []time.Duration) MCPResult {
	added := Added(direct, via) // before Summarize sorts the rounds apart
	return MCPResult{Tool: tool, Warmup: warmup, Direct: specs[0].String(), Via: specs[1].String(),
		Added: added, D: Summarize(direct), V: Summarize(via)}
}
