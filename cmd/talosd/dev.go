package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/demo"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/query/chserver"
	"github.com/talos-audit/talos/receipts/verify"
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
	if f.NatsURL == "" {
		f.NatsListen = demo.FreeOr(os.Stderr, f.NatsListen, "the embedded nats-server")
		if f.HeapPretouch {
			go pretouchHeap() // meanwhile ClickHouse starts; startNATS waits for it
		}
	}
	// ClickHouse: a private server under the data dir.
	if f.ClickhouseAddr == "" {
		ch, err := d.startClickHouse(ctx, dir, f.ClickhouseDatabase)
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
		f.WebAddr = demo.FreeOr(os.Stderr, f.WebAddr, "the dashboard")
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
		if !d.DemoCalls || s.Registry.InForce == nil {
			return nil
		}
		n, err := demo.Run(ctx, demo.RunOptions{URL: s.NatsURL, Login: f.natsLogin(), RegistryDigest: s.Registry.InForce.Digest(),
			KeyDir: filepath.Join(f.DataDir, "keys"), Out: os.Stdout})
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

// devKeys fills in the keys the flags do not name with keys generated
// once under keyDir (demo.Keys).
func devKeys(f *Flags, keyDir string) error {
	k := demo.Keys{SigningKey: f.SigningKey, TrustedKeys: f.TrustedKeys, ResponderKeys: f.ResponderKeys, CapabilityIssuers: f.CapabilityIssuers}
	if err := k.Ensure(keyDir); err != nil {
		return err
	}
	f.SigningKey, f.TrustedKeys, f.ResponderKeys, f.CapabilityIssuers = k.SigningKey, k.TrustedKeys, k.ResponderKeys, k.CapabilityIssuers
	return nil
}

// devRegistry installs the demo manifests in regDir, unless --registry
// names one, which it loads once to refuse a bad one before ClickHouse
// starts (about 10 s) rather than after.
func devRegistry(f *Flags, regDir string) error {
	if f.Registry != "" {
		if _, err := enforce.LoadRegistry(f.Registry); err != nil {
			return fmt.Errorf("registry: %w", err)
		}
		return nil
	}
	sub, _ := fs.Sub(demoRegistry, "demo/registry")
	f.Registry = regDir
	return demo.InstallRegistry(sub, regDir)
}

// startClickHouse starts the private clickhouse-server under dir, on
// --clickhouse-port or a free port; its writer and reader see database only.
func (d *devCmd) startClickHouse(ctx context.Context, dir, database string) (*chserver.Server, error) {
	port := d.ClickhousePort
	if port != 0 && demo.FreeOr(os.Stderr, fmt.Sprintf("127.0.0.1:%d", port), "the private ClickHouse") == "127.0.0.1:0" {
		port = 0
	}
	fmt.Fprintln(os.Stderr, "starting a private clickhouse-server (about 10 s)…")
	return chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), TCPPort: port, Databases: []string{database}})
}

// responderKeyFile is the private key next to the first --responder-keys file.
func responderKeyFile(f *Flags) string {
	if len(f.ResponderKeys) == 0 {
		return "RESPONDER.key"
	}
	return strings.TrimSuffix(f.ResponderKeys[0], ".pub") + ".key"
}

func printBanner(f *Flags, s *stack) {
	b := demo.Banner{
		NatsURL: s.NatsURL, NatsCA: f.natsLogin().CA, NatsUsers: "none: NATS authentication is off (--nats-auth none)",
		Talosctl:       "go run ./cmd/talosctl --nats-url " + s.NatsURL,
		ClickhouseAddr: f.ClickhouseAddr, Database: f.ClickhouseDatabase,
		Registry: f.Registry, RegistryDigest: "no enforce role in this process",
		SigningKey: f.SigningKey, Mode: f.Mode, Capabilities: f.Capabilities, Issuers: strings.Join(f.CapabilityIssuers, ","),
		Dashboard: "off (--no-web)",
		KeyDir:    filepath.Join(f.DataDir, "keys"), RedactionKey: redactionKeyPath(f), ResponderKey: responderKeyFile(f),
		SignersDir: f.signersDir(), CheckpointInterval: f.CheckpointInterval,
	}
	switch path := f.natsAuthPath(); {
	case f.NatsURL != "":
		b.NatsUsers = "those of the nats-server at --nats-url"
	case path != "":
		b.NatsUsers = path + " (talosctl picks its user from it)"
		b.Talosctl += " --nats-auth " + path
	}
	if s.WebURL != "" {
		b.Dashboard = s.WebURL + "  (the token is in " + f.webTokenFile() + ")"
		if f.WebToken != "" {
			b.Dashboard = s.WebURL
		}
	}
	if r := s.Registry; r.InForce != nil {
		b.Registry, b.RegistryDigest = r.source(), r.InForce.Digest()
		if r.overridden() {
			b.RegistryNote = r.advice()
		}
	}
	_ = b.Write(os.Stdout)
}

// demoVerify waits until the demo's receipts are in ClickHouse, then
// verifies the whole database the way `talosctl verify` does.
func demoVerify(ctx context.Context, f *Flags, want int) error {
	keys, err := verify.LoadTrustedKeys(f.TrustedKeys...)
	if err != nil {
		return err
	}
	conn, err := f.Reader().Open(ctx, f.ClickhouseDatabase)
	if err != nil {
		return err
	}
	defer conn.Close()
	rep, err := query.AwaitAndVerify(ctx, conn, f.ClickhouseDatabase, query.ReceiptQuery{EP: demo.EP}, uint64(want), 30*time.Second, keys)
	if err != nil {
		return err
	}
	fmt.Printf("\n%d demo receipts are in ClickHouse; verify: OK (%d receipts in %d chains: signatures, chain links, stored columns)\n", want, rep.Checked, len(rep.Chains))
	return nil
}
