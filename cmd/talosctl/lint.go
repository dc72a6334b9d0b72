package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce/registrylint"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

// registryLintCmd is the completeness test (CM-COMPLETE) run against a live
// server: what the upstream's tools/list offers that the registry does not
// classify (a call to it would be denied in prod, or classified wrongly).
// It needs no NATS: it reads manifest files and talks MCP to the upstream.
type registryLintCmd struct {
	Server        string        `name:"server" required:"" help:"The upstream: <server_id>=<http(s) URL> (streamable HTTP) or <server_id>=<command> [args...] (stdio; \"...\" and '...' quote)."`
	Registry      string        `name:"registry" type:"path" help:"Manifest file or directory of *.json manifests (as talosd --registry). Without it, or without a manifest for the server, every live tool is MISSING."`
	ServerID      string        `name:"server-id" help:"Compare with this server_id's manifest instead of the one --server names (--server may then omit its '<server_id>=')."`
	Timeout       time.Duration `name:"timeout" default:"30s" help:"Limit for starting or reaching the server and listing its tools."`
	WriteSkeleton string        `name:"write-skeleton" type:"path" placeholder:"FILE" help:"Write a manifest skeleton with the missing tools, prompts and resources to FILE (which must not exist): tool_class suggested from readOnlyHint, trust_level unknown. Review before publishing."`
	WritePins     bool          `name:"write-pins" help:"Pin the definitions the server lists now: set definition_sha256 of its tools in the --registry manifest file (rewritten, indented), then lint against it. Review the live definitions first; publish and pin the registry afterwards."`
}

func (c *registryLintCmd) Run(g *Globals) error {
	spec, manifestID, err := c.check()
	if err != nil {
		return err
	}
	rep := registrylint.Report{ServerID: manifestID, Server: spec.String(), Registry: c.Registry}
	manifest, err := rep.LoadManifest()
	if err != nil {
		return failed("registry lint: %v", err)
	}
	if !rep.ManifestFound && !g.JSON {
		if c.Registry == "" {
			fmt.Printf("note: no --registry: every tool of %s is reported MISSING\n", manifestID)
		} else {
			fmt.Printf("note: %s has no manifest for server_id %s: every tool is reported MISSING\n", c.Registry, manifestID)
		}
	}
	live, err := c.listTools(spec, &rep)
	if err != nil {
		return err
	}
	if c.WritePins {
		if manifest, err = rep.WritePinsFile(live); err != nil {
			return failed("registry lint: --write-pins: %v", err)
		}
	}
	registrylint.Lint(&rep, manifest, live, mcpup.ActionEnum)
	if c.WriteSkeleton != "" && rep.MissingAny() {
		if err := rep.WriteSkeleton(c.WriteSkeleton); err != nil {
			return failed("registry lint: --write-skeleton: %v", err)
		}
	}
	if g.JSON {
		if err := printJSON(os.Stdout, rep); err != nil {
			return err
		}
	} else if err := rep.WriteText(os.Stdout, c.WriteSkeleton != ""); err != nil {
		return err
	}
	if !rep.OK {
		return failed("registry lint: server %s: %d tool(s), %d action(s), %d prompt(s) and %d resource(s) missing from the registry, %d definition(s) drifted from their pins",
			manifestID, rep.Counts[registrylint.Missing], rep.Counts[registrylint.MissingAction], rep.Counts[registrylint.MissingPrompt], rep.Counts[registrylint.MissingResource], rep.Counts[registrylint.Drift])
	}
	return nil
}

// check reads the flags: the server to call and the server_id whose
// manifest it is compared with.
func (c *registryLintCmd) check() (mcpup.Spec, string, error) {
	spec, err := mcpup.ParseSpecFor(c.Server, c.ServerID)
	if err != nil {
		return spec, "", usage("registry lint: --server: %v", err)
	}
	if c.Timeout <= 0 {
		return spec, "", usage("registry lint: --timeout must be positive")
	}
	manifestID := spec.ServerID
	if c.ServerID != "" {
		if !schemas.ValidID(c.ServerID) {
			return spec, "", usage("registry lint: --server-id %q must match %s", c.ServerID, schemas.IDPattern)
		}
		manifestID = c.ServerID
	}
	if c.WritePins && c.Registry == "" {
		return spec, "", usage("registry lint: --write-pins needs --registry (the manifest to pin)")
	}
	if c.WriteSkeleton != "" {
		if _, err := os.Lstat(c.WriteSkeleton); err == nil {
			return spec, "", usage("registry lint: --write-skeleton %s already exists (it is never overwritten)", c.WriteSkeleton)
		}
	}
	return spec, manifestID, nil
}

// listTools connects to the server, declaring the client capabilities
// the gateway declares, and lists its tools (those the gateway sees),
// noting its name and version in rep.
func (c *registryLintCmd) listTools(spec mcpup.Spec, rep *registrylint.Report) ([]*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	live, info, err := mcpup.ListServer(ctx, spec, &mcp.Implementation{Name: "talosctl-registry-lint", Version: "1"},
		mcpup.WithTerminateWait(time.Second), mcpup.WithRejected(func(r mcpup.Rejected) { rep.Reject(r.Kind, r.Name, r.Reason) }), mcpup.WithFeatures(rep.Features),
		// The gateway's capabilities: a server may list some tools only
		// to a client that declares them.
		mcpup.WithClientOptions(&mcp.ClientOptions{Capabilities: mcpup.ClientCapabilities()}))
	if err != nil {
		return nil, failed("registry lint: %v", err)
	}
	if info != nil {
		rep.ServerName, rep.ServerVersion = info.Name, info.Version
	}
	return live, nil
}
