package main

import (
	"context"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/conformance"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
)

type conformanceCmd struct {
	EPID         string        `name:"ep-id" default:"talosctl" help:"Enforcement point id the run speaks as."`
	Capability   string        `name:"capability" type:"existingfile" help:"The agent's capability chain (needed when talosd requires capabilities)."`
	AgentKey     string        `name:"agent-key" type:"path" help:"The chain holder's key (.key): signs envelopes and delegations."`
	IssuerKey    string        `name:"issuer-key" type:"path" help:"A capability issuer key talosd trusts: mints an expired capability."`
	ResponderKey string        `name:"responder-key" type:"path" help:"A responder key talosd trusts: sets and clears a kill switch on the run's own session."`
	TrustedKeys  []string      `name:"trusted-keys" type:"path" help:"talosd's public keys (.pub or directories): verify receipts and events."`
	Registry     string        `name:"registry" type:"path" help:"The registry talosd enforces (INV-01, expected side effects)."`
	ReadTool     string        `name:"read-tool" default:"files/read_file" help:"SERVER/TOOL: a read tool with a strict input schema and a path argument /path."`
	WriteTool    string        `name:"write-tool" default:"files/write_file" help:"SERVER/TOOL: a write tool taking {path, content}."`
	GatewayURL   string        `name:"gateway-url" help:"An MCP gateway's streamable HTTP URL (https://…/mcp) to probe (AUTH-01, AUTH-02, TLS-01; DISC-01, DISC-02 with --gateway-token-file)."`
	GatewayCA    string        `name:"gateway-ca" type:"existingfile" help:"PEM CA certificate the gateway's TLS certificate chains to."`
	GatewayToken string        `name:"gateway-token-file" type:"existingfile" help:"A file holding a principal's bearer token for the gateway (never printed): DISC-01, DISC-02 compare its tools/list with --registry and --gateway-capability."`
	GatewayCap   string        `name:"gateway-capability" type:"existingfile" help:"That principal's capability chain, as its --principals entry names it (none: the registry alone limits it)."`
	GatewayServ  []string      `name:"gateway-server" help:"A server_id the gateway's upstreams serve (DISC-02 expects its permitted tools listed); default every server of --registry. Repeat for several."`
	Timeout      time.Duration `name:"timeout" default:"10s" help:"Wait for each decision."`
	EventWait    time.Duration `name:"event-wait" default:"30s" help:"Wait for the sink to store the run's ToolCallEvents."`
}

func (c *conformanceCmd) Run(g *Globals) error {
	cfg := conformance.Config{Registry: c.Registry, Timeout: c.Timeout, EventWait: c.EventWait}
	responder, err := conformance.Files{Capability: c.Capability, AgentKey: c.AgentKey, IssuerKey: c.IssuerKey, ResponderKey: c.ResponderKey,
		TrustedKeys: c.TrustedKeys, GatewayURL: c.GatewayURL, GatewayCA: c.GatewayCA, GatewayToken: c.GatewayToken, GatewayCapability: c.GatewayCap,
		GatewayServers: c.GatewayServ, ReadTool: c.ReadTool, WriteTool: c.WriteTool}.Load(&cfg)
	if err != nil {
		return usage("%v", err)
	}
	nc, err := g.connect(schemas.NATSRoleEnforcement, c.EPID)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if cfg.Client, err = ep.NewClient(nc, js, c.EPID); err != nil {
		return usage("%v", err)
	}
	defer cfg.Client.Close()
	ctx := context.Background()
	if responder != nil {
		rc, err := g.connect("responder", "")
		if err != nil {
			return err
		}
		defer rc.Close()
		cfg.Control = control.NewControlClient(rc, responder, control.LocalActor())
	}
	if conn, err := g.clickhouse(ctx); err == nil {
		defer conn.Close()
		cfg.Events = func(ctx context.Context, ids []string) (map[string][]byte, error) {
			return query.ToolCallEvents(ctx, conn, g.ClickhouseDatabase, c.EPID, ids)
		}
	}
	rep, err := conformance.Run(ctx, cfg)
	if err != nil {
		return failed("%v", err)
	}
	if err = rep.Write(os.Stdout, g.JSON); err == nil && !rep.OK() {
		err = failed("%d applicable conformance test(s) failed", rep.Failed)
	}
	return err
}
