package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/credential"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

const discTest = "cmd/talos-mcp-gateway/principals_test.go TestToolsListPerPrincipal"

// discReason is why DISC-01 and DISC-02 need a principal's token: only
// the gateway answers tools/list, per principal.
const discReason = "tools/list is answered by the gateway alone, per principal, from the registry and that principal's capability; " +
	"talosd never sees it"

// gatewayDenied is the JSON-RPC error code of a call the gateway refuses
// (ingest/gateway CodeDenied); its data is a denial.
const gatewayDenied = -32030

// denial is the data of the gateway's refusal of a call.
type denial struct {
	Decision    string   `json:"decision"`
	ReasonCodes []string `json:"reason_codes"`
	ToolCallID  string   `json:"tool_call_id"`
	ReceiptID   string   `json:"receipt_id"`
}

// Discovery runs the DISC rows alone, as Run does: a check of a gateway's
// tools/list for one principal, which needs no enforcement-point client.
func Discovery(ctx context.Context, cfg Config) []Result {
	r := newRun(cfg.withDefaults())
	r.runDiscovery(ctx)
	return []Result{r.rows[GroupCSP+"|DISC-01|"], r.rows[GroupCSP+"|DISC-02|"]}
}

// runDiscovery probes DISC-01 and DISC-02 over an MCP session with the
// principal's token: what its tools/list shows is compared with what
// enforce.Discovery lets it see of the registry.
func (r *run) runDiscovery(ctx context.Context) {
	d1, d2 := r.probeDiscovery(ctx)
	for i, x := range []Result{d1, d2} {
		x.Group, x.ID, x.Test = GroupCSP, fmt.Sprintf("DISC-%02d", i+1), discTest
		r.set(x)
	}
}

func (r *run) probeDiscovery(ctx context.Context) (Result, Result) {
	both := func(status, reason string) (Result, Result) {
		return Result{Status: status, Reason: reason}, Result{Status: status, Reason: reason}
	}
	gw := r.cfg.Gateway
	switch {
	case gw == nil || gw.URL == "":
		return both(NotApplicable, "no gateway given (--gateway-url, --gateway-token-file): "+discReason)
	case gw.Token == "":
		return both(NotApplicable, "no principal's token given (--gateway-token-file): "+discReason)
	case r.cfg.Registry == "":
		return both(NotApplicable, "no registry given (--registry): nothing to compare the principal's tools/list with")
	}
	e, err := r.expectation()
	if err != nil {
		return both(Fail, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, 3*r.cfg.Timeout)
	defer cancel()
	cs, closeSession, err := r.connectGateway(ctx)
	if err != nil {
		return both(Fail, "an MCP session with the principal's token: "+err.Error())
	}
	defer closeSession()
	listed := map[string]*mcp.Tool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return both(Fail, "tools/list: "+err.Error())
		}
		listed[t.Name] = t
	}
	return r.disc01(ctx, cs, e, listed), e.disc02(listed)
}

// expected is what the registry and a principal's capability let it see,
// by enforce.Discovery's rules without the gateway-wide exfiltration guard.
type expected struct {
	what    string              // the registry and capability, for the reasons
	servers string              // the servers checked, for the reasons
	visible map[string][]permit // tool name → where it is permitted
	// want are the permitted tools of the checked servers; hidden the
	// others of the checked servers, read tools first.
	want, hidden []Tool
}

// permit is a permitted tool of one server: all of it (actions nil), or
// the actions at pointer.
type permit struct {
	pointer string
	actions []string
}

// expectation reads the registry and the principal's capability.
func (r *run) expectation() (*expected, error) {
	reg, err := enforce.LoadRegistry(r.cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("--registry: %w", err)
	}
	gw := r.cfg.Gateway
	var v enforce.Viewer
	e := &expected{what: "the registry (digest " + reg.Digest() + ")", servers: "every server of the registry", visible: map[string][]permit{}}
	if gw.Capability == nil {
		e.what += " alone (no --gateway-capability: a principal without one)"
	} else if v, err = enforce.ViewerOf(gw.Capability); err != nil {
		return nil, fmt.Errorf("--gateway-capability: %w", err)
	} else {
		e.what += " and the capability of " + gw.Capability.Holder()
	}
	ms := reg.Manifests()
	for _, s := range gw.Servers {
		if !slices.ContainsFunc(ms, func(m schemas.Manifest) bool { return m.ServerID == s }) {
			return nil, fmt.Errorf("--gateway-server %s: the registry has no manifest of this server_id", s)
		}
	}
	if gw.Servers != nil {
		e.servers = "server(s) " + strings.Join(gw.Servers, ", ")
	}
	d := enforce.Discovery{Registry: reg}
	var writes []Tool
	for _, m := range ms {
		checked := gw.Servers == nil || slices.Contains(gw.Servers, m.ServerID)
		for _, t := range m.Tools {
			tool := Tool{m.ServerID, t.ToolName}
			switch vis := d.See(v, m.ServerID, t.ToolName); {
			case !vis.Hidden:
				e.visible[t.ToolName] = append(e.visible[t.ToolName], permit{t.ActionPointer, vis.Actions})
				if checked {
					e.want = append(e.want, tool)
				}
			case !checked:
			case t.ToolClass == schemas.ClassWrite:
				writes = append(writes, tool)
			default:
				e.hidden = append(e.hidden, tool)
			}
		}
	}
	e.hidden = append(e.hidden, writes...)
	return e, nil
}

// connectGateway opens an MCP session to the gateway as the principal;
// its token goes only into the Authorization header, over TLS (or to a
// loopback address).
func (r *run) connectGateway(ctx context.Context) (*mcp.ClientSession, func(), error) {
	gw := r.cfg.Gateway
	u, err := url.Parse(gw.URL)
	if err != nil {
		return nil, nil, err
	}
	if ip := net.ParseIP(u.Hostname()); u.Scheme != "https" && u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, nil, fmt.Errorf("the token is sent over https only, or to a loopback address: %s", u.Redacted())
	}
	tr := &http.Transport{TLSClientConfig: gw.TLS}
	t := &mcp.StreamableClientTransport{Endpoint: gw.URL, MaxRetries: -1, DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: &credential.Transport{Base: tr, Session: gw.Token}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "talos-conformance", Version: "1"}, nil).Connect(ctx, t, nil)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, nil, err
	}
	return cs, func() { _ = cs.Close(); tr.CloseIdleConnections() }, nil
}

// disc01 passes when every listed tool is permitted and a registered tool
// the principal may not see is refused by the gateway itself.
func (r *run) disc01(ctx context.Context, cs *mcp.ClientSession, e *expected, listed map[string]*mcp.Tool) Result {
	if outside := e.outside(listed); len(outside) > 0 {
		return Result{Status: Fail, Reason: fmt.Sprintf("listed, but not permitted by %s: %s", e.what, strings.Join(outside, ", "))}
	}
	seen := fmt.Sprintf("the %d tools listed are all permitted by %s", len(listed), e.what)
	i := slices.IndexFunc(e.hidden, func(t Tool) bool { return listed[t.Name] == nil })
	if i < 0 {
		return Result{Status: Pass, Reason: seen + "; no registry tool of " + e.servers + " is hidden from this principal, so no refused call shows"}
	}
	return callHidden(ctx, cs, e.hidden[i], seen)
}

// outside are the listed tools the principal is not permitted, sorted:
// by name, or an action-based tool by the actions its schema offers.
func (e *expected) outside(listed map[string]*mcp.Tool) []string {
	var out []string
	for name, t := range listed {
		perms := e.visible[name]
		if len(perms) == 0 {
			out = append(out, name)
			continue
		}
		if slices.ContainsFunc(perms, func(p permit) bool { return p.actions == nil }) {
			continue
		}
		offered, _ := mcpup.ActionEnum(t.InputSchema, perms[0].pointer)
		var beyond []string
		for _, a := range offered {
			if !slices.ContainsFunc(perms, func(p permit) bool { return slices.Contains(p.actions, a) }) {
				beyond = append(beyond, a)
			}
		}
		switch {
		case len(offered) == 0:
			out = append(out, fmt.Sprintf("%s (no action enum at %s: any action)", name, perms[0].pointer))
		case len(beyond) > 0:
			out = append(out, fmt.Sprintf("%s (actions %s not permitted)", name, strings.Join(beyond, ", ")))
		}
	}
	slices.Sort(out)
	return out
}

// callHidden calls t, a tool the principal may not see, without
// arguments. The gateway refuses a hidden tool itself (TOOL_HIDDEN),
// before any upstream, and names the receipt of the worker's decision, so
// the call cannot act; write tools are called only when no read tool is
// hidden.
func callHidden(ctx context.Context, cs *mcp.ClientSession, t Tool, seen string) Result {
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: t.Name, Arguments: map[string]any{}})
	var we *jsonrpc.Error
	var d denial
	res := Result{Status: Fail}
	switch {
	case err == nil:
		res.Reason = fmt.Sprintf("%s; but tools/call of the hidden %s got a result: the gateway forwarded it", seen, t)
	case !errors.As(err, &we) || we.Code != gatewayDenied || json.Unmarshal(we.Data, &d) != nil:
		res.Reason = fmt.Sprintf("%s; tools/call of the hidden %s: %v, want the gateway's denial (JSON-RPC %d)", seen, t, err, gatewayDenied)
	case d.Decision != schemas.DecisionDeny || !slices.Contains(d.ReasonCodes, schemas.CodeToolHidden) || d.ReceiptID == "":
		res.Reason = fmt.Sprintf("%s; tools/call of the hidden %s: %s %v with receipt %q, want deny %s with a receipt",
			seen, t, d.Decision, d.ReasonCodes, d.ReceiptID, schemas.CodeToolHidden)
	default:
		res.Status = Pass
		res.Reason = fmt.Sprintf("%s; tools/call of the hidden %s: refused by the gateway, JSON-RPC %d %v (call %s)",
			seen, t, gatewayDenied, d.ReasonCodes, d.ToolCallID)
	}
	if d.ReceiptID != "" {
		res.ReceiptIDs = []string{d.ReceiptID}
	}
	return res
}

// disc02 passes when every permitted tool of the checked servers is
// listed.
func (e *expected) disc02(listed map[string]*mcp.Tool) Result {
	var missing []string
	for _, t := range e.want {
		if listed[t.Name] == nil {
			missing = append(missing, t.String())
		}
	}
	switch {
	case len(missing) > 0:
		return Result{Status: Fail, Reason: fmt.Sprintf("permitted by %s, but not listed: %s", e.what, strings.Join(missing, ", "))}
	case len(e.want) == 0:
		return Result{Status: NotApplicable, Reason: fmt.Sprintf("%s permit no tool of %s: nothing must be listed", e.what, e.servers)}
	}
	return Result{Status: Pass, Reason: fmt.Sprintf("all %d tools of %s permitted by %s are listed", len(e.want), e.servers, e.what)}
}
