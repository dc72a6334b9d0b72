// Command talosctl is the Talos tool for responders and auditors: it makes
// keys, acts as an enforcement point (call), verifies the audit trail in
// ClickHouse or in a file, and benchmarks a running stack.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime/pprof"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/query"
)

// Globals are the flags every command shares; each also reads TALOS_<FLAG>.
type Globals struct {
	NatsURL           string               `group:"nats" name:"nats-url" default:"nats://127.0.0.1:4222" help:"NATS URL (user:password@ in it wins over the flags below)."`
	NatsUser          string               `group:"nats" name:"nats-user" help:"NATS user (default: the user for the command's role in --nats-auth)."`
	NatsPassword      string               `group:"nats" name:"nats-password" help:"NATS password for --nats-user (prefer TALOS_NATS_PASSWORD: arguments are visible to other local users)."`
	NatsAuth          string               `group:"nats" name:"nats-auth" help:"talosd's NATS users file; talosctl logs in as the user for what it does (call: the enforcement point of --ep-id; bench: the worker). Default: talos-data/nats-auth.json when it exists. 'none': no credentials."`
	NatsCA            string               `group:"nats" name:"nats-ca" type:"path" help:"CA certificate (PEM) the NATS server's certificate must chain to; with it, a server without TLS is refused. Default: nats-tls/ca.pem beside --nats-auth (talosd's data dir, where it keeps its embedded server's CA) when it exists, else the system's roots."`
	query.ClientFlags `group:"clickhouse"` // --clickhouse-*: address, database, user (a reader), TLS
	JSON              bool                 `name:"json" help:"Print JSON instead of human-readable output."`
	CPUProfile        string               `name:"cpuprofile" type:"path" help:"Write a CPU profile of the command to this file (for go tool pprof)."`
}

type cli struct {
	Globals

	Keys        keysCmd        `cmd:"" help:"Manage Ed25519 signing keys."`
	Call        callCmd        `cmd:"" help:"Act as an enforcement point: send one tool call envelope and print the decision. Exit 0 for any decision (allow, deny, require_approval: read it from the output or --json), 1 when none came (which an enforcement point takes as a deny)."`
	Verify      verifyCmd      `cmd:"" help:"Verify the audit trail (signatures, hash chains, checkpoints' Merkle roots, stored columns) in ClickHouse or in a file; exit 1 naming each missing, altered, reordered, duplicated or foreign record. --receipt ID prints an inclusion proof. A ClickHouse replica still fetching rows inserted through another is named first (WARNING)."`
	VerifyProof verifyProofCmd `cmd:"" name:"verify-proof" help:"Check an inclusion proof (from verify --receipt) offline, with only the public keys."`
	Query       queryCmd       `cmd:"" help:"Canned auditor questions."`
	Export      exportCmd      `cmd:"" help:"Export signed records (receipts, tool calls, checkpoints) as JSON lines or CSV, verifiable offline with verify --file."`
	Bench       benchCmd       `cmd:"" help:"Measure a running stack: decision latency with N concurrent enforcement points, end-to-end events/s, kill-switch propagation."`
	BenchMCP    benchMCPCmd    `cmd:"" name:"bench-mcp" help:"Measure what an MCP gateway adds per tools/call: the same call to a server directly and through the gateway, interleaved, one in flight; p50/p90/p99 per side and the difference."`
	Conformance conformanceCmd `cmd:"" help:"Run the conformance suite against a live stack (CSP test matrix, UTS 6.0.2.9 checks, the capability protocol's tests): each test pass, fail or not_applicable with the receipts that prove it; exit 1 if an applicable test fails."`
	Synth       synthCmd       `cmd:"" help:"Benchmarks: write N signed, chained, checkpointed synthetic receipts straight into ClickHouse (to measure verify at scale)."`

	Killswitch killswitchCmd `cmd:"" help:"Kill switches: stop calls in a scope on every worker (signed control commands)."`
	Quarantine quarantineCmd `cmd:"" help:"Quarantine sessions on every worker."`
	Revoke     revokeCmd     `cmd:"" help:"Revoke a capability id or an agent (stored; enforced by capability checks)."`
	Approve    approveCmd    `cmd:"" help:"Release a call parked for human approval (decision require_approval) by its tool_call_id."`
	Reject     rejectCmd     `cmd:"" help:"Refuse a call parked for human approval; --reason is required."`
	Registry   registryCmd   `cmd:"" help:"Publish, pin and show tool registry bundles."`
	Replay     replayCmd     `cmd:"" help:"The correlation_id replay cache: stats, check, flush."`
	Status     statusCmd     `cmd:"" help:"Live workers: the control seq each has applied, its registry digest, whether it decides."`
	Cap        capCmd        `cmd:"" help:"Capabilities (the CP- requirements): issue, delegate and inspect signed capability chains."`

	LogProof       query.LogProofCmd       `cmd:"" name:"log-proof" help:"Write the proof bundle of one receipt (or ToolCallEvent) in the transparency log: the stored record, its inclusion proof and the witnessed checkpoint."`
	LogConsistency query.LogConsistencyCmd `cmd:"" name:"log-consistency" help:"Print the transparency log's consistency proof between two sizes (or from a checkpoint you kept), checked before it is printed."`
	VerifyLogProof query.VerifyLogProofCmd `cmd:"" name:"verify-log-proof" help:"Check a proof bundle (from log-proof) offline, with only the log's key, the witness policy and the public keys."`
}

// exitError carries an exit code: 1 for a failed check, 2 for usage.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }

func failed(format string, a ...any) error { return exitError{1, fmt.Errorf(format, a...)} }
func usage(format string, a ...any) error  { return exitError{2, fmt.Errorf(format, a...)} }

func main() {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err)
	}
	k, err := parser.Parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "talosctl:", err)
		fmt.Fprintf(os.Stderr, "run '%s --help' for usage\n", commandOf(err))
		os.Exit(2)
	}
	stop, err := startCPUProfile(c.CPUProfile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "talosctl:", err)
		os.Exit(2)
	}
	err = k.Run(&c.Globals, &c.ClientFlags)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talosctl:", err)
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

// newParser is talosctl's command line parser, filling c.
func newParser(c *cli) (*kong.Kong, error) {
	return kong.New(c,
		kong.Name("talosctl"),
		kong.Description("Talos control and audit tool. Exit codes: 0 ok, 1 the check or command failed, 2 usage. Every flag also reads TALOS_<FLAG>. Durations take days too (7d, 1d12h)."),
		kong.DefaultEnvars("TALOS"),
		kong.TypeMapper(reflect.TypeOf(time.Duration(0)), durationMapper()),
		// The connection flags every command shares come after its own.
		kong.ExplicitGroups([]kong.Group{
			{Key: "nats", Title: "NATS connection:"},
			{Key: "clickhouse", Title: "ClickHouse connection:"},
		}),
	)
}

// commandOf is the command a parse error is about ("talosctl keys gen"),
// for the usage hint: its own --help says what it takes.
func commandOf(err error) string {
	var pe *kong.ParseError
	if errors.As(err, &pe) && pe.Context != nil {
		if n := pe.Context.Selected(); n != nil {
			return n.FullPath()
		}
	}
	return "talosctl"
}

// durationMapper reads every duration flag with query.ParseDuration, so
// --since takes days (7d) as the dashboard does.
func durationMapper() kong.MapperFunc {
	return func(ctx *kong.DecodeContext, target reflect.Value) error {
		var s string
		if err := ctx.Scan.PopValueInto("duration", &s); err != nil {
			return err
		}
		d, err := query.ParseDuration(s)
		if err != nil {
			return err
		}
		target.SetInt(int64(d))
		return nil
	}
}

// startCPUProfile starts a CPU profile written to path (none if path is
// empty) and returns what stops it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "talosctl: cpuprofile:", err)
		}
	}, nil
}

// connect opens a NATS connection for work of role (worker, responder or
// enforcement; epID names the enforcement point), logging in as
// natsauth.Login picks (the auth file defaults to talos-data/nats-auth.json
// when it exists). Configuration mistakes are usage errors (exit 2), an
// unreachable or refusing server is a failure (exit 1), its error with a
// hint when the certificate or the user is refused (natsauth.Login.Explain).
func (g *Globals) connect(role, epID string) (*nats.Conn, error) {
	login := natsauth.Login{URL: g.NatsURL, User: g.NatsUser, Password: g.NatsPassword, UsersFile: g.NatsAuth, Default: natsauth.DevUsersFile, CA: g.NatsCA}
	creds, err := login.Options(role, epID)
	if err != nil {
		return nil, usage("%v", err)
	}
	opts := append([]nats.Option{nats.Name("talosctl " + role), nats.Timeout(5 * time.Second)}, creds...)
	nc, err := nats.Connect(g.NatsURL, opts...)
	if err != nil {
		return nil, failed("connect %s: %v", natsauth.Redact(g.NatsURL), login.Explain(err, role, epID))
	}
	return nc, nil
}

// clickhouse opens the ClickHouse database of the flags; failing to is a
// failure (exit 1).
func (g *Globals) clickhouse(ctx context.Context) (driver.Conn, error) {
	conn, err := g.Endpoint().Open(ctx, g.ClickhouseDatabase)
	if err != nil {
		return nil, failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	return conn, nil
}
