package main

import (
	"context"
	"embed"
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/demo"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/query/chserver"
	"github.com/talos-audit/talos/receipts/verify"
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
	if err := devKeys(f, filepath.Join(dir, "keys")); err != nil {
		return err
	}
	if err := devRegistry(f, filepath.Join(dir, "registry")); err != nil {
		return err
	}
	// NATS: a busy default port falls back to a free one (the banner says which).
	if f.NatsURL == "" && !addrFree(f.NatsListen) {
		fmt.Fprintf(os.Stderr, "%s is busy; the embedded nats-server takes a free port instead\n", f.NatsListen)
		f.NatsListen = "127.0.0.1:0"
	}
	// ClickHouse: a private server under the data dir.
	if f.ClickhouseAddr == "" {
		ch, err := d.startClickHouse(ctx, dir)
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
	if !slices.Contains(f.NatsEPs, demo.EP) {
		f.NatsEPs = append(f.NatsEPs, demo.EP)
	}
	err = runDaemon(ctx, f, d.ready(f))
	if errors.Is(err, errExitAfterDemo) {
		return nil
	}
	return err
}

var errExitAfterDemo = errors.New("exit after demo")

// ready is what talosd dev does once the stack is up: print the banner,
// then send the demo traffic and verify its receipts in ClickHouse.
func (d *devCmd) ready(f *Flags) func(context.Context, *stack) error {
	return func(ctx context.Context, s *stack) error {
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
	}
}

// devKeys generates, once, the keys talosd dev needs under keyDir unless
// the flags name them: the signing key (also trusted), a responder key for
// talosctl's control commands (talosctl finds it at
// talos-data/keys/responder.key), and a capability issuer with the demo
// agent's key and capability (the demo traffic carries signed capabilities
// and sender signatures, CP-SFC).
func devKeys(f *Flags, keyDir string) error {
	if f.SigningKey == "" {
		f.SigningKey = filepath.Join(keyDir, "signing.key")
		if err := demo.EnsureKeyPair(filepath.Join(keyDir, "signing")); err != nil {
			return err
		}
		if len(f.TrustedKeys) == 0 {
			f.TrustedKeys = []string{filepath.Join(keyDir, "signing.pub")}
		}
	}
	if len(f.ResponderKeys) == 0 {
		if err := demo.EnsureKeyPair(filepath.Join(keyDir, "responder")); err != nil {
			return err
		}
		f.ResponderKeys = []string{filepath.Join(keyDir, "responder.pub")}
	}
	if len(f.CapabilityIssuers) == 0 {
		if err := demo.Prepare(keyDir); err != nil {
			return err
		}
		f.CapabilityIssuers = []string{filepath.Join(keyDir, demo.IssuerKey+".pub")}
	}
	return nil
}

// devRegistry installs the demo manifests in regDir, unless --registry
// names one.
func devRegistry(f *Flags, regDir string) error {
	if f.Registry != "" {
		return nil
	}
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
	return nil
}

// startClickHouse starts the private clickhouse-server under dir, on
// --clickhouse-port or, when that is busy, a free port.
func (d *devCmd) startClickHouse(ctx context.Context, dir string) (*chserver.Server, error) {
	port := d.ClickhousePort
	if port != 0 && !addrFree(fmt.Sprintf("127.0.0.1:%d", port)) {
		fmt.Fprintf(os.Stderr, "port %d is busy; the private ClickHouse takes a free port instead\n", port)
		port = 0
	}
	fmt.Fprintln(os.Stderr, "starting a private clickhouse-server (about 10 s)…")
	return chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), TCPPort: port})
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
		filepath.Join(keyDir, demo.CapabilityFile), filepath.Join(keyDir, demo.Agent+".key"))
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

// demoTraffic sends the demo calls through the real pipeline, as
// enforcement point demo.EP with its own NATS user, printing a table of
// their decisions. It returns how many receipts the demo produced.
func demoTraffic(ctx context.Context, f *Flags, s *stack) (int, error) {
	opts, err := demoLogin(f)
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(s.NatsURL, opts...)
	if err != nil {
		return 0, fmt.Errorf("connect as enforcement point %s: %w", demo.EP, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	c, err := ingest.NewClient(nc, js, demo.EP)
	if err != nil {
		return 0, err
	}
	signer, err := demo.Signer(filepath.Join(f.DataDir, "keys"))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEMO CALL\tTOOL\tDECISION\tREASONS\tRECEIPT")
	n, err := demo.Send(ctx, c, s.Registry.Digest(), signer, func(dc demo.Case, dec *schemas.Decision) {
		reasons := strings.Join(dec.ReasonCodes, ",")
		if reasons == "" {
			reasons = "-"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%s\n", dc.What, dc.Server, orDash(dc.Tool), dec.Decision, reasons, dec.ReceiptID)
	})
	if err != nil {
		return n, err
	}
	return n, tw.Flush()
}

// demoLogin are the NATS options of the demo traffic: enforcement point
// demo.EP, with --nats-user/--nats-password when given with --nats-url,
// else its user in the users file (optional with --nats-url).
func demoLogin(f *Flags) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name("talosd dev demo " + demo.EP)}
	if f.NatsURL != "" && f.NatsUser != "" {
		return append(opts, nats.UserInfo(f.NatsUser, f.NatsPassword), nats.CustomInboxPrefix(schemas.EPInboxPrefix(demo.EP))), nil
	}
	path := f.natsAuthPath()
	if path == "" {
		return opts, nil
	}
	a, err := natsauth.Load(path)
	switch {
	case err == nil:
		u, ok := a.Find(schemas.NATSRoleEnforcement, demo.EP)
		if !ok {
			return nil, fmt.Errorf("NATS auth file %s has no user for ep_id %s", path, demo.EP)
		}
		return append(opts, u.ConnectOptions()...), nil
	case f.NatsURL == "" || !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	return opts, nil
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
		got, err := query.CountReceipts(ctx, conn, f.ClickhouseDatabase, query.ReceiptQuery{EP: demo.EP})
		if err == nil && got >= uint64(want) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d demo receipts reached ClickHouse in 30 s (err %v)", got, want, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	keys, err := verify.LoadTrustedKeys(f.TrustedKeys...)
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
