package main

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/query/chserver"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

//go:embed demo/registry/*.json
var demoRegistry embed.FS

// devCmd is `talosd dev`: the one-command local stack.
type devCmd struct {
	ClickhousePort int  `name:"clickhouse-port" default:"9000" help:"Native port of the private ClickHouse (0: any free port; a busy port falls back to a free one)."`
	DemoCalls      bool `name:"demo" default:"true" negatable:"" help:"Send a short burst of demo traffic once the stack is up."`
	ExitAfterDemo  bool `name:"exit-after-demo" help:"Stop after the demo traffic has reached ClickHouse (for scripted checks)."`
	Web            bool `name:"web" default:"true" negatable:"" help:"Also run the web dashboard (role web) and print its URL with the token."`
}

func (d *devCmd) Run(f *Flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(f.DataDir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(f.DataDir)
	if err != nil {
		return err
	}
	f.DataDir = dir

	// Keys: generated once, kept under the data dir.
	if f.SigningKey == "" {
		keyDir := filepath.Join(dir, "keys")
		f.SigningKey = filepath.Join(keyDir, "signing.key")
		if _, err := os.Stat(f.SigningKey); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(keyDir, 0o700); err != nil {
				return err
			}
			k, err := receipts.GenerateKey()
			if err != nil {
				return err
			}
			if err := receipts.WriteKeyPair(k, filepath.Join(keyDir, "signing")); err != nil {
				return err
			}
		}
		if len(f.TrustedKeys) == 0 {
			f.TrustedKeys = []string{filepath.Join(keyDir, "signing.pub")}
		}
	}
	// A responder key for talosctl's control commands (talosctl finds it
	// at talos-data/keys/responder.key).
	if len(f.ResponderKeys) == 0 {
		keyDir := filepath.Join(dir, "keys")
		if _, err := os.Stat(filepath.Join(keyDir, "responder.key")); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(keyDir, 0o700); err != nil {
				return err
			}
			k, err := receipts.GenerateKey()
			if err != nil {
				return err
			}
			if err := receipts.WriteKeyPair(k, filepath.Join(keyDir, "responder")); err != nil {
				return err
			}
		}
		f.ResponderKeys = []string{filepath.Join(keyDir, "responder.pub")}
	}
	// A capability issuer and the demo agent's key: the demo traffic
	// carries signed capabilities and sender signatures (seed 002).
	if len(f.CapabilityIssuers) == 0 {
		keyDir := filepath.Join(dir, "keys")
		for _, name := range []string{"issuer", demoAgent} {
			if err := ensureKeyPair(filepath.Join(keyDir, name)); err != nil {
				return err
			}
		}
		f.CapabilityIssuers = []string{filepath.Join(keyDir, "issuer.pub")}
		if err := writeDemoCapability(keyDir); err != nil {
			return err
		}
	}
	// Registry: the demo manifests, unless one was given.
	if f.Registry == "" {
		regDir := filepath.Join(dir, "registry")
		if err := os.MkdirAll(regDir, 0o755); err != nil {
			return err
		}
		entries, _ := demoRegistry.ReadDir("demo/registry")
		for _, e := range entries {
			b, _ := demoRegistry.ReadFile("demo/registry/" + e.Name())
			if err := os.WriteFile(filepath.Join(regDir, e.Name()), b, 0o644); err != nil {
				return err
			}
		}
		f.Registry = regDir
	}
	// NATS: a busy default port falls back to a free one (the banner says which).
	if f.NatsURL == "" && !addrFree(f.NatsListen) {
		fmt.Fprintf(os.Stderr, "%s is busy; the embedded nats-server takes a free port instead\n", f.NatsListen)
		f.NatsListen = "127.0.0.1:0"
	}
	// ClickHouse: a private server under the data dir.
	if f.ClickhouseAddr == "" {
		port := d.ClickhousePort
		if port != 0 && !addrFree(fmt.Sprintf("127.0.0.1:%d", port)) {
			fmt.Fprintf(os.Stderr, "port %d is busy; the private ClickHouse takes a free port instead\n", port)
			port = 0
		}
		fmt.Fprintln(os.Stderr, "starting a private clickhouse-server (about 10 s)…")
		ch, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), TCPPort: port})
		if err != nil {
			return err
		}
		defer ch.Stop()
		f.ClickhouseAddr = ch.Addr()
	}
	if d.ExitAfterDemo {
		f.HTTPAddr = ""
	}
	// The dashboard: a busy default port falls back to a free one.
	if d.Web {
		if !slices.Contains(f.Roles, "web") {
			f.Roles = append(f.Roles, "web")
		}
		if !addrFree(f.WebAddr) {
			fmt.Fprintf(os.Stderr, "%s is busy; the dashboard takes a free port instead\n", f.WebAddr)
			f.WebAddr = "127.0.0.1:0"
		}
	}
	// The demo traffic logs in as its own enforcement point.
	if !slices.Contains(f.NatsEPs, demoEP) {
		f.NatsEPs = append(f.NatsEPs, demoEP)
	}
	err = runDaemon(ctx, f, func(ctx context.Context, s *stack) error {
		printBanner(f, s)
		if !d.DemoCalls || s.Registry == nil {
			return nil
		}
		n, err := demoTraffic(ctx, f, s)
		if err != nil {
			return fmt.Errorf("demo traffic: %w", err)
		}
		if err := demoVerify(ctx, f, n); err != nil {
			return err
		}
		if d.ExitAfterDemo {
			return errExitAfterDemo
		}
		fmt.Println("\nThe stack keeps running; Ctrl-C stops it.")
		return nil
	})
	if errors.Is(err, errExitAfterDemo) {
		return nil
	}
	return err
}

var errExitAfterDemo = errors.New("exit after demo")

// ensureKeyPair writes name.key and name.pub unless name.key exists.
func ensureKeyPair(name string) error {
	if _, err := os.Stat(name + ".key"); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	k, err := receipts.GenerateKey()
	if err != nil {
		return err
	}
	return receipts.WriteKeyPair(k, name)
}

// demoAgent is the agent id (and key file name) of the demo traffic.
const demoAgent = "demo-agent"

// demoCapabilityFile is where talosd dev writes the demo agent's
// capability chain, under the key directory.
const demoCapabilityFile = demoAgent + ".cap.json"

// writeDemoCapability issues the demo agent a 24-hour capability for every
// tool of the demo servers, signed by the dev issuer key, and writes it to
// keyDir/demo-agent.cap.json (replaced on every start).
func writeDemoCapability(keyDir string) error {
	issuer, err := receipts.LoadPrivateKey(filepath.Join(keyDir, "issuer.key"))
	if err != nil {
		return fmt.Errorf("demo capability issuer: %w", err)
	}
	_, agent, err := receipts.LoadPublicKey(filepath.Join(keyDir, demoAgent+".pub"))
	if err != nil {
		return fmt.Errorf("demo agent key: %w", err)
	}
	now := time.Now().UTC()
	c, err := enforce.IssueCapability(issuer, schemas.Capability{
		CapabilityID:     uuid.Must(uuid.NewV7()).String(),
		Issuer:           "talos-dev",
		Subject:          demoAgent,
		SubjectPublicKey: enforce.PublicKeyString(agent),
		Scopes:           []string{"tool:files:*", "tool:github:*"},
		IssuedAt:         now.Format(schemas.TimeFormat),
		ExpiresAt:        now.Add(24 * time.Hour).Format(schemas.TimeFormat),
	})
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(schemas.CapabilityChain{Capability: c}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(keyDir, demoCapabilityFile), append(b, '\n'), 0o644)
}

// demoSigner signs the demo traffic as the demo agent, or is nil when
// talosd dev was given its own --capability-issuers (no demo chain).
func demoSigner(f *Flags) (*ingest.CallSigner, error) {
	keyDir := filepath.Join(f.DataDir, "keys")
	raw, err := os.ReadFile(filepath.Join(keyDir, demoCapabilityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	key, err := receipts.LoadPrivateKey(filepath.Join(keyDir, demoAgent+".key"))
	if err != nil {
		return nil, fmt.Errorf("demo agent key: %w", err)
	}
	return ingest.NewCallSigner(raw, key)
}

// responderKeyFile is the private key next to the first --responder-keys file.
func responderKeyFile(f *Flags) string {
	if len(f.ResponderKeys) == 0 {
		return "RESPONDER.key"
	}
	return strings.TrimSuffix(f.ResponderKeys[0], ".pub") + ".key"
}

func printBanner(f *Flags, s *stack) {
	host, port, _ := net.SplitHostPort(f.ClickhouseAddr)
	users := "none: NATS authentication is off (--nats-auth none)"
	talosctl := "go run ./cmd/talosctl --nats-url " + s.NatsURL
	switch path := f.natsAuthPath(); {
	case f.NatsURL != "":
		users = "those of the nats-server at --nats-url"
	case path != "":
		users = path + " (talosctl picks its user from it)"
		talosctl += " --nats-auth " + path
	}
	dashboard := "off (--no-web)"
	if s.WebURL != "" {
		dashboard = s.WebURL + "  (the token is in " + f.webTokenFile() + ")"
		if f.WebToken != "" {
			dashboard = s.WebURL
		}
	}
	digest := "no enforce role in this process"
	if s.Registry != nil {
		digest = s.Registry.Digest()
	}
	keyDir := filepath.Join(f.DataDir, "keys")
	capFlags := fmt.Sprintf("--capability %s --agent-key %s",
		filepath.Join(keyDir, demoCapabilityFile), filepath.Join(keyDir, demoAgent+".key"))
	fmt.Printf(`
Talos dev stack is up.
  NATS:        %s
  NATS users:  %s
  ClickHouse:  %s (database %s)
  registry:    %s (%s)
  signing key: %s
  mode:        %s (capabilities %s, issuers %s)
  dashboard:   %s

Try:
  %s call --server files --tool read_file --args '{"path":"README.md"}' %s
  %s query secret-uses --redaction-key %s --value AKIA`+`DEMO7EXAMPLE2KEY
  %s killswitch set tool:files/read_file --reason "drill" --wait --responder-key %s
  %s status --responder-key %s
  clickhouse-client --host %s --port %s --query "SELECT time, server_id, tool_name, decision, reason_codes FROM %s.v_decisions ORDER BY time"
  go run ./cmd/talosctl --clickhouse-addr %s query denial-reasons --since 24h     # talosctl query list: the others
  go run ./cmd/talosctl --clickhouse-addr %s verify --trusted-keys %s
  go run ./cmd/talosctl --clickhouse-addr %s verify --trusted-keys %s --receipt RECEIPT --out proof.json   # a checkpoint covers a receipt once it is %s old
  go run ./cmd/talosctl verify-proof --proof proof.json --trusted-keys %s

`, s.NatsURL, users, f.ClickhouseAddr, f.ClickhouseDatabase, f.Registry, digest, f.SigningKey, f.Mode,
		f.Capabilities, strings.Join(f.CapabilityIssuers, ","), dashboard,
		talosctl, capFlags,
		"go run ./cmd/talosctl --clickhouse-addr "+f.ClickhouseAddr, redactionKeyPath(f),
		talosctl, responderKeyFile(f), talosctl, responderKeyFile(f),
		host, port, f.ClickhouseDatabase, f.ClickhouseAddr, f.ClickhouseAddr, f.signersDir(),
		f.ClickhouseAddr, f.signersDir(), f.CheckpointInterval, f.signersDir())
}

// demoCase is one demo call and what it shows.
type demoCase struct {
	what   string
	server string
	tool   string
	args   any
	tweak  func(*schemas.ToolCall)
	raw    []byte // sent as-is instead of a built envelope
	result any    // when set, a post event follows an allow
	// unsigned sends the call without the demo agent's capability.
	unsigned bool
}

func demoCases() []demoCase {
	body := "Fixes the flaky test.\n"
	sum := sha256.Sum256([]byte(body))
	return []demoCase{
		{what: "read a file (read tool)", server: "files", tool: "read_file", args: map[string]any{"path": "README.md"},
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "# Talos\n"}}}},
		{what: "list a directory", server: "files", tool: "list_directory", args: map[string]any{"path": "."},
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "README.md\n"}}}},
		{what: "write a file with an idempotency key", server: "files", tool: "write_file",
			args: map[string]any{"path": "notes.txt", "content": "hello\n"}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "demo-write-1" },
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "ok"}}}},
		{what: "write without an idempotency key", server: "files", tool: "write_file",
			args: map[string]any{"path": "notes.txt", "content": "hello\n"}},
		{what: "open a PR whose body hash matches", server: "github", tool: "create-pr",
			args: map[string]any{"title": "Fix", "body": body, "files": []any{map[string]any{"path": "a.go", "content": "package a\n"}}},
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "pr-1"
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: hex.EncodeToString(sum[:])}}
			}},
		{what: "open a PR whose body was altered", server: "github", tool: "create-pr",
			args: map[string]any{"title": "Fix", "body": body + "rm -rf /\n", "files": []any{map[string]any{"path": "a.go", "content": "package a\n"}}},
			tweak: func(c *schemas.ToolCall) {
				c.IdempotencyKey = "pr-2"
				c.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/body", Hash: hex.EncodeToString(sum[:])}}
			}},
		{what: "upload a blob that is not base64", server: "files", tool: "upload_blob",
			args: map[string]any{"data": "%%% not base64 %%%"}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "blob-1" }},
		{what: "upload a blob over its size limit", server: "files", tool: "upload_blob",
			args: map[string]any{"data": base64.StdEncoding.EncodeToString(make([]byte, 70000))}, tweak: func(c *schemas.ToolCall) { c.IdempotencyKey = "blob-2" }},
		{what: "call a tool missing from the registry", server: "files", tool: "delete_everything", args: map[string]any{}},
		{what: "declare the wrong tool class", server: "github", tool: "list-prs", args: map[string]any{"repo": "talos"},
			tweak: func(c *schemas.ToolCall) { c.ToolClass = "write" }},
		{what: "call without a capability", server: "files", tool: "read_file", args: map[string]any{"path": "README.md"}, unsigned: true},
		{what: "read a file outside the workspace", server: "files", tool: "read_file", args: map[string]any{"path": "../../etc/passwd"}},
		{what: "pass an argument the tool does not declare", server: "files", tool: "list_directory",
			args: map[string]any{"path": ".", "recursive": true}},
		{what: "write a config holding a secret (redacted in the record)", server: "files", tool: "write_file",
			args:   map[string]any{"path": "deploy.env", "content": "AWS_ACCESS_KEY_ID=AKIA" + "DEMO7EXAMPLE2KEY\nDB_PASSWORD=hunter2\n"},
			tweak:  func(c *schemas.ToolCall) { c.IdempotencyKey = "demo-env-1" },
			result: map[string]any{"content": []any{map[string]any{"type": "text", "text": "wrote deploy.env"}}}},
		{what: "send an envelope with duplicate keys", server: "files",
			raw: []byte(`{"schema_version":"talos.tool_call.v1","phase":"pre","phase":"post","tool_call_id":"%s","ep_id":"` + demoEP + `"}`)},
	}
}

// demoEP is the ep_id of the demo traffic.
const demoEP = "demo-ep"

// demoTraffic sends the demo cases through the real pipeline, as
// enforcement point demoEP with its own NATS user, and waits for their
// receipts to reach ClickHouse.
// It returns how many receipts the demo produced.
func demoTraffic(ctx context.Context, f *Flags, s *stack) (int, error) {
	opts := []nats.Option{nats.Name("talosd dev demo " + demoEP)}
	if f.NatsURL != "" && f.NatsUser != "" {
		opts = append(opts, nats.UserInfo(f.NatsUser, f.NatsPassword), nats.CustomInboxPrefix(schemas.EPInboxPrefix(demoEP)))
	} else if path := f.natsAuthPath(); path != "" {
		a, err := natsauth.Load(path)
		switch {
		case err == nil:
			u, ok := a.Find(schemas.NATSRoleEnforcement, demoEP)
			if !ok {
				return 0, fmt.Errorf("NATS auth file %s has no user for ep_id %s", path, demoEP)
			}
			opts = append(opts, u.ConnectOptions()...)
		case f.NatsURL == "" || !errors.Is(err, fs.ErrNotExist):
			return 0, err
		}
	}
	nc, err := nats.Connect(s.NatsURL, opts...)
	if err != nil {
		return 0, fmt.Errorf("connect as enforcement point %s: %w", demoEP, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	c, err := ingest.NewClient(nc, js, demoEP)
	if err != nil {
		return 0, err
	}
	signer, err := demoSigner(f)
	if err != nil {
		return 0, err
	}
	n := 0
	defer c.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEMO CALL\tTOOL\tDECISION\tREASONS\tRECEIPT")
	for _, dc := range demoCases() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var dec *schemas.Decision
		if dc.raw != nil {
			id := uuid.Must(uuid.NewV7()).String()
			dec, err = c.Send(cctx, schemas.PhasePre, dc.server, id, []byte(fmt.Sprintf(string(dc.raw), id)))
		} else {
			var call *schemas.ToolCall
			call, err = ingest.NewCall(c.EPID(), dc.server, dc.tool, dc.args)
			if err == nil {
				call.RegistryDigest = s.Registry.Digest()
				if dc.tweak != nil {
					dc.tweak(call)
				}
				if !dc.unsigned && signer != nil {
					call.Actor.AgentID = signer.Holder()
					err = signer.Sign(call)
				}
			}
			if err == nil {
				started := time.Now()
				dec, err = c.Call(cctx, call)
				if err == nil && dec.Decision == schemas.DecisionAllow && dc.result != nil {
					var post *schemas.ToolCall
					if post, err = ingest.PostOf(call, dc.result, true, started, time.Now()); err == nil {
						_, err = c.Call(cctx, post)
						n++
					}
				}
			}
		}
		cancel()
		if err != nil {
			return n, fmt.Errorf("%s: %w", dc.what, err)
		}
		n++
		reasons := strings.Join(dec.ReasonCodes, ",")
		if reasons == "" {
			reasons = "-"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%s\n", dc.what, dc.server, orDash(dc.tool), dec.Decision, reasons, dec.ReceiptID)
	}
	return n, tw.Flush()
}

// demoVerify waits until the demo's receipts are in ClickHouse, then
// verifies the whole database the way `talosctl verify` does.
func demoVerify(ctx context.Context, f *Flags, want int) error {
	conn, err := query.Open(ctx, f.ClickhouseAddr, f.ClickhouseDatabase)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got uint64
		err := conn.QueryRow(ctx, "SELECT count() FROM "+f.ClickhouseDatabase+".v_receipts WHERE ep_id = '"+demoEP+"'").Scan(&got)
		if err == nil && got >= uint64(want) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d demo receipts reached ClickHouse in 30 s (err %v)", got, want, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	keys, err := receipts.LoadTrustedKeys(f.TrustedKeys...)
	if err != nil {
		return err
	}
	rep, err := query.VerifyDatabase(ctx, conn, f.ClickhouseDatabase, keys, false, nil)
	if err != nil {
		return err
	}
	if !rep.OK() {
		for _, p := range rep.Problems {
			fmt.Println(p.String())
		}
		return fmt.Errorf("verify: %d problems", len(rep.Problems))
	}
	fmt.Printf("\n%d demo receipts are in ClickHouse; verify: OK (%d receipts in %d chains: signatures, chain links, stored columns)\n", want, rep.Checked, len(rep.Chains))
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
