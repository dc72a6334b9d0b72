package query

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// TestServiceFlags parses talosd's ClickHouse flags the way talosd does
// (embedded, each also from TALOS_<FLAG>): the defaults are the three
// users, the flags and variables reach the right login, and a password
// file that cannot be read fails the parse.
func TestServiceFlags(t *testing.T) {
	var cli struct {
		ServiceFlags
	}
	parser := envParser(t, &cli)
	if _, err := parser.Parse([]string{"--clickhouse-addr", "ch:9440"}); err != nil {
		t.Fatal(err)
	}
	l := cli.Logins()
	if l.Admin.user() != AdminUser || l.Writer.user() != WriterUser || l.Reader.user() != ReaderUser || l.Reader.Addr != "ch:9440" {
		t.Fatalf("default logins %+v", l)
	}
	if cli.Reader() != l.Reader || l.Writer.TLS.on() {
		t.Fatalf("reader %+v, writer TLS %+v", cli.Reader(), l.Writer.TLS)
	}
	dir := t.TempDir()
	pw := filepath.Join(dir, "writer.password")
	if err := os.WriteFile(pw, []byte("w\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TALOS_CLICKHOUSE_PASSWORD_FILE", pw)
	t.Setenv("TALOS_CLICKHOUSE_ADMIN_PASSWORD", "a")
	t.Setenv("TALOS_CLICKHOUSE_CA", otherCA(t))
	if _, err := parser.Parse([]string{"--clickhouse-addr", "ch:9440", "--clickhouse-reader-user", "auditor", "--clickhouse-server-name", "ch.internal"}); err != nil {
		t.Fatal(err)
	}
	l = cli.Logins()
	if got, _ := l.Writer.password(); got != "w" || l.Admin.Password != "a" || l.Reader.user() != "auditor" || l.Reader.Password != "" {
		t.Fatalf("logins %+v", l)
	}
	for _, e := range []Endpoint{l.Admin, l.Writer, l.Reader} {
		if e.TLS.ServerName != "ch.internal" || e.TLS.CAFile == "" || !e.TLS.on() {
			t.Fatalf("TLS %+v", e.TLS)
		}
	}
	t.Setenv("TALOS_CLICKHOUSE_PASSWORD_FILE", filepath.Join(dir, "missing"))
	if _, err := parser.Parse(nil); err == nil || !strings.Contains(err.Error(), "password file") {
		t.Fatalf("a missing password file parsed: %v", err)
	}
}

// TestServiceFlagsCluster: the replicas of a cluster are the addresses of
// --clickhouse-addr, in order; --clickhouse-cluster and the quorum reach
// the migrations; a quorum without a cluster, or a cluster name DDL
// cannot carry, fails the command line.
func TestServiceFlagsCluster(t *testing.T) {
	var cli struct {
		ServiceFlags
	}
	parser := envParser(t, &cli)
	if _, err := parser.Parse([]string{"--clickhouse-addr", "ch1:9440, ch2:9440", "--clickhouse-cluster", "talos", "--clickhouse-insert-quorum", "2"}); err != nil {
		t.Fatal(err)
	}
	if got := cli.Logins().Writer.Addrs(); !slices.Equal(got, []string{"ch1:9440", "ch2:9440"}) {
		t.Fatalf("replicas %v", got)
	}
	if c := cli.Cluster(); c.Name != "talos" || c.InsertQuorum != 2 || c.writerSettings()["insert_quorum"] != 2 {
		t.Fatalf("cluster %+v", c)
	}
	// Over TLS each replica's certificate is checked against the host it
	// was dialled by, unless a name is given.
	one, _ := TLS{Enabled: true}.Config("ch1:9440")
	several, _ := TLS{Enabled: true}.Config("ch1:9440,ch2:9440")
	if one.ServerName != "ch1" || several.ServerName != "" {
		t.Fatalf("server names %q and %q, want ch1 and each replica's own", one.ServerName, several.ServerName)
	}
	for _, args := range [][]string{{"--clickhouse-insert-quorum", "2"}, {"--clickhouse-cluster", "talos;drop"}} {
		if _, err := parser.Parse(args); err == nil || !strings.Contains(err.Error(), "--clickhouse-") {
			t.Errorf("%v parsed: %v", args, err)
		}
	}
}

// TestClientFlags: talosctl logs in as the reader unless told otherwise,
// and a client certificate needs its key.
func TestClientFlags(t *testing.T) {
	var cli struct {
		ClientFlags
	}
	parser := envParser(t, &cli)
	if _, err := parser.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if e := cli.Endpoint(); e.user() != ReaderUser || e.Addr != "127.0.0.1:9000" || e.TLS.on() {
		t.Fatalf("default endpoint %+v", e)
	}
	if _, err := parser.Parse([]string{"--clickhouse-cert", "client.pem"}); err == nil || !strings.Contains(err.Error(), "both its certificate and its key") {
		t.Fatalf("a certificate without a key parsed: %v", err)
	}
}

// envParser parses the flags of cli as talosd and talosctl do: each flag
// also from TALOS_<FLAG>.
func envParser(t *testing.T, cli any) *kong.Kong {
	t.Helper()
	parser, err := kong.New(cli, kong.DefaultEnvars("TALOS"))
	if err != nil {
		t.Fatal(err)
	}
	return parser
}
