package demo

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/schemas"
)

// Keys are the key files of a talosd dev stack: the signing key, the keys
// whose control events are applied, the responders and the capability
// issuers (DESIGN.md §4, talosd dev).
type Keys struct {
	SigningKey        string
	TrustedKeys       []string
	ResponderKeys     []string
	CapabilityIssuers []string
}

// Ensure fills in those of k that are empty with keys generated once under
// keyDir: a signing key (also trusted when no TrustedKeys are given), a
// responder key for talosctl's control commands (responder.key, where
// talosctl finds it), and a capability issuer with the demo agent's key
// and capability (Prepare), so the demo traffic carries signed
// capabilities and sender signatures (CP-SFC).
func (k *Keys) Ensure(keyDir string) error {
	if k.SigningKey == "" {
		k.SigningKey = filepath.Join(keyDir, "signing.key")
		if err := EnsureKeyPair(filepath.Join(keyDir, "signing")); err != nil {
			return err
		}
		if len(k.TrustedKeys) == 0 {
			k.TrustedKeys = []string{filepath.Join(keyDir, "signing.pub")}
		}
	}
	if len(k.ResponderKeys) == 0 {
		if err := EnsureKeyPair(filepath.Join(keyDir, "responder")); err != nil {
			return err
		}
		k.ResponderKeys = []string{filepath.Join(keyDir, "responder.pub")}
	}
	if len(k.CapabilityIssuers) == 0 {
		if err := Prepare(keyDir); err != nil {
			return err
		}
		k.CapabilityIssuers = []string{filepath.Join(keyDir, IssuerKey+".pub")}
	}
	return nil
}

// RunOptions configure Run.
type RunOptions struct {
	// URL is the NATS server; Login picks the credentials of EP.
	URL   string
	Login natsauth.Login
	// RegistryDigest is the digest of the registry the workers enforce.
	RegistryDigest string
	// KeyDir holds the demo agent's key and capability (Prepare).
	KeyDir string
	// Out receives the table of decisions.
	Out io.Writer
}

// Run sends the demo calls (Send) through the real pipeline as
// enforcement point EP, with its own NATS user, and writes a table of their
// decisions to o.Out. It returns how many receipts the demo produced.
func Run(ctx context.Context, o RunOptions) (int, error) {
	opts, err := o.Login.Options(schemas.NATSRoleEnforcement, EP)
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(o.URL, append(opts, nats.Name("talosd dev demo "+EP))...)
	if err != nil {
		return 0, fmt.Errorf("connect as enforcement point %s: %w", EP, err)
	}
	defer nc.Close()
	js, err := jspub.New(nc)
	if err != nil {
		return 0, err
	}
	c, err := ep.NewClient(nc, js, EP)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	signer, err := Signer(o.KeyDir)
	if err != nil {
		return 0, err
	}
	tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEMO CALL\tTOOL\tDECISION\tREASONS\tRECEIPT")
	n, err := Send(ctx, c, o.RegistryDigest, signer, func(dc Case, dec *schemas.Decision) {
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%s\n", dc.What, dc.Server, orDash(dc.Tool), dec.Decision, orDash(strings.Join(dec.ReasonCodes, ",")), dec.ReceiptID)
	})
	if err != nil {
		return n, err
	}
	return n, tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Banner is what talosd dev prints once its stack is up: where everything
// is, and commands to try against it with the demo agent's capability and
// the secret the demo traffic plants.
type Banner struct {
	NatsURL, NatsUsers string
	// NatsCA is the CA file of the server's TLS certificate, "" for none
	// known.
	NatsCA string
	// Talosctl is the talosctl command line that reaches this stack's NATS.
	Talosctl                                string
	ClickhouseAddr, Database                string
	Registry, RegistryDigest                string
	SigningKey, Mode, Capabilities, Issuers string
	Dashboard                               string
	KeyDir, RedactionKey, ResponderKey      string
	SignersDir                              string
	CheckpointInterval                      time.Duration
	// RegistryNote, if set, is a line printed under the registry's.
	RegistryNote string
}

// Write writes the banner to w.
func (b Banner) Write(w io.Writer) error {
	host, port, _ := net.SplitHostPort(b.ClickhouseAddr)
	capFlags := fmt.Sprintf("--capability %s --agent-key %s",
		filepath.Join(b.KeyDir, CapabilityFile), filepath.Join(b.KeyDir, Agent+".key"))
	talosctlCH := "go run ./cmd/talosctl --clickhouse-addr " + b.ClickhouseAddr
	natsLine := b.NatsURL
	note := ""
	if b.RegistryNote != "" {
		note = "\n               " + b.RegistryNote
	}
	if b.NatsCA != "" {
		natsLine += "  (TLS; clients trust the CA " + b.NatsCA + ")"
	}
	_, err := fmt.Fprintf(w, `
Talos dev stack is up.
  NATS:        %s
  NATS users:  %s
  ClickHouse:  %s (database %s)
  registry:    %s (%s)%s
  signing key: %s
  mode:        %s (capabilities %s, issuers %s)
  dashboard:   %s

Try:
  %s call --server files --tool read_file --args '{"path":"README.md"}' %s
  %s query secret-uses --redaction-key %s --value AKIA`+`DEMO7EXAMPLE2KEY
  %s killswitch set tool:files/read_file --reason "drill" --wait --responder-key %s
  %s status --responder-key %s
  clickhouse-client --host %s --port %s --query "SELECT time, server_id, tool_name, decision, reason_codes FROM %s.v_decisions ORDER BY time"
  %s query denial-reasons --since 24h     # talosctl query list: the others
  %s verify --trusted-keys %s
  %s verify --trusted-keys %s --receipt RECEIPT --out proof.json   # a checkpoint covers a receipt once it is %s old
  go run ./cmd/talosctl verify-proof --proof proof.json --trusted-keys %s

`, natsLine, b.NatsUsers, b.ClickhouseAddr, b.Database, b.Registry, b.RegistryDigest, note, b.SigningKey, b.Mode,
		b.Capabilities, b.Issuers, b.Dashboard,
		b.Talosctl, capFlags, talosctlCH, b.RedactionKey,
		b.Talosctl, b.ResponderKey, b.Talosctl, b.ResponderKey,
		host, port, b.Database, talosctlCH, talosctlCH, b.SignersDir,
		talosctlCH, b.SignersDir, b.CheckpointInterval, b.SignersDir)
	return err
}

// InstallRegistry copies the manifests of fsys (its *.json files) into
// dir, creating dir: talosd dev's registry, embedded in the binary.
func InstallRegistry(fsys fs.FS, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names, err := fs.Glob(fsys, "*.json")
	for _, name := range names {
		b, rerr := fs.ReadFile(fsys, name)
		if rerr == nil {
			rerr = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if rerr != nil {
			return rerr
		}
	}
	return err
}

// FreeOr is addr when a TCP listener could bind it now, else (saying so on
// w) "127.0.0.1:0": a busy default port of talosd dev falls back to a free
// one for what.
func FreeOr(w io.Writer, addr, what string) string {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(w, "%s is busy; %s takes a free port instead\n", addr, what)
		return "127.0.0.1:0"
	}
	_ = ln.Close()
	return addr
}
