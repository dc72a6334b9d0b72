// Package conformance checks a running Talos stack against the test
// matrices of the specifications it implements: the CSP tool safety
// profile's matrix (INV-01 … INC-01), the UTS 6.0.2.9 conformance checks and
// the capability protocol's required tests. It acts as an enforcement
// point (ingest/ep), and, when given them, as a responder (a kill switch),
// as an auditor (the ToolCallEvents a sink stored) and as a client of an
// MCP gateway's HTTP mode. Every row is pass, fail or not_applicable, with
// the reason and the receipt ids that prove it; a row is never pass
// without evidence gathered in this run.
package conformance

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// Statuses of a Result.
const (
	Pass          = "pass"
	Fail          = "fail"
	NotApplicable = "not_applicable"
)

// Groups of results: the specification whose test list names the row.
const (
	GroupCSP = "CSP"
	GroupUTS = "UTS 6.0.2.9"
	GroupCP  = "CP"
)

// Result is one row of the report.
type Result struct {
	Group string `json:"group"`
	ID    string `json:"id"`
	// Check names the 6.0.2.9 check (and the requirement row that holds
	// it) for the UTS rows.
	Check      string   `json:"check,omitempty"`
	Status     string   `json:"status"`
	Reason     string   `json:"reason"`
	ReceiptIDs []string `json:"receipt_ids,omitempty"`
	// Test is the repository test that shows the requirement where this
	// run cannot.
	Test string `json:"test,omitempty"`
}

// Report is every row, in the order of the matrices.
type Report struct {
	Results []Result `json:"results"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
	NA      int      `json:"not_applicable"`
}

// OK reports that no applicable test failed.
func (r *Report) OK() bool { return r.Failed == 0 }

// Tool names a registry tool: server_id and tool_name.
type Tool struct{ Server, Name string }

// ParseTool reads SERVER/TOOL.
func ParseTool(s string) (Tool, error) {
	server, name, ok := strings.Cut(s, "/")
	if !ok || server == "" || name == "" {
		return Tool{}, fmt.Errorf("%q is not SERVER/TOOL", s)
	}
	return Tool{server, name}, nil
}

func (t Tool) String() string { return t.Server + "/" + t.Name }

// EventLookup returns the signed ToolCallEvent CloudEvents stored for the
// given tool_call_ids (by id; an id not yet stored is absent). query
// implements it over ClickHouse.
type EventLookup func(ctx context.Context, toolCallIDs []string) (map[string][]byte, error)

// Gateway is an MCP gateway's streamable HTTP endpoint to probe.
type Gateway struct {
	URL string
	// TLS is the client configuration (its RootCAs trust the gateway's
	// certificate); nil uses the system's.
	TLS *tls.Config
	// Token is a principal's bearer token (a static token or a JWT) for
	// the DISC rows; "" leaves them not_applicable. It is sent as the
	// Authorization header of the DISC probe's session and nowhere else.
	Token string
	// Capability is that principal's capability chain (the one its
	// principals entry names); nil: the principal holds none, and the
	// registry alone limits what it sees.
	Capability *schemas.CapabilityChain
	// Servers are the server_ids the gateway's upstreams serve, whose
	// permitted tools DISC-02 expects listed; nil: every server of the
	// registry.
	Servers []string
}

// Config is what a run may use; only Client is required. The zero value
// of every other field turns the rows that need it not_applicable.
type Config struct {
	Client *ep.Client
	// Signer attaches the agent's capability chain and signs envelopes:
	// needed when talosd requires capabilities. AgentKey is the chain
	// holder's key (the same the signer signs with), for delegations.
	Signer   *ep.CallSigner
	AgentKey *receipts.PrivateKey
	// IssuerKey is a capability issuer talosd trusts (an expired
	// capability is minted with it).
	IssuerKey *receipts.PrivateKey
	// Control is a responder's control client (a kill switch is set and
	// cleared on the run's own session).
	Control *control.ControlClient
	// TrustedKeys verify the receipts' signatures and links.
	TrustedKeys verify.KeySet
	// Events reads stored ToolCallEvents (FR-EVT-007).
	Events EventLookup
	// Registry is the bundle talosd enforces (a manifest file or a
	// directory), for INV-01 and the expected side effects.
	Registry string
	Gateway  *Gateway
	// ReadTool is a read tool with an input schema that forbids unknown
	// arguments and a path argument at /path (path_pointers); WriteTool a
	// write document tool taking {path, content}.
	ReadTool, WriteTool Tool
	// PayloadBytes is the size of the oversized argument (default 1 MiB
	// + 1 KiB: over talosd's default --max-args-bytes).
	PayloadBytes int
	// Timeout bounds each decision (default 10 s) and the wait for
	// stored events (default 30 s).
	Timeout, EventWait time.Duration
}

// Run runs every check against the stack and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("conformance: no enforcement-point client")
	}
	r := newRun(cfg.withDefaults())
	r.runCalls(ctx)
	r.runCapabilities(ctx)
	r.runIncident(ctx)
	r.runEvents(ctx)
	r.runReceipts()
	r.runGateway(ctx)
	r.runDiscovery(ctx)
	r.runStatic()
	return r.report(), nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.EventWait <= 0 {
		cfg.EventWait = 30 * time.Second
	}
	if cfg.PayloadBytes <= 0 {
		cfg.PayloadBytes = 1<<20 + 1<<10
	}
	return cfg
}

// Write prints the report: as indented JSON when asJSON, else as the
// table (WriteText).
func (r *Report) Write(w io.Writer, asJSON bool) error {
	if !asJSON {
		return r.WriteText(w)
	}
	b, err := r.MarshalIndent()
	if err == nil {
		_, err = fmt.Fprintf(w, "%s\n", b)
	}
	return err
}

// WriteText prints the report as a table and a summary line.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tID\tSTATUS\tREASON\tRECEIPTS")
	for _, x := range r.Results {
		id := x.ID
		if x.Check != "" {
			id += " " + x.Check
		}
		reason := x.Reason
		if x.Test != "" {
			reason += " (see " + x.Test + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", x.Group, id, x.Status, reason, strings.Join(x.ReceiptIDs, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d passed, %d failed, %d not applicable\n", r.Passed, r.Failed, r.NA)
	return err
}

// MarshalIndent is the report as indented JSON.
func (r *Report) MarshalIndent() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }
