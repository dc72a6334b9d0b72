// Package chserver runs a private clickhouse-server process: a generated
// configuration in a directory of its own, listening on 127.0.0.1 only on
// ports picked at start, stopped with its process group. `talosd dev` runs
// its ClickHouse this way; the tests do too, through testenv.
package chserver

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ErrNotFound is returned when no clickhouse-server binary is found;
// its message names the fix.
var ErrNotFound = errors.New("clickhouse-server not found: install it with `sudo apt-get install -y clickhouse-server clickhouse-client`")

// searchDirs are searched after PATH (Debian installs the server in /usr/sbin,
// which is not on a normal user's PATH).
var searchDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/bin"}

// Options configure Start. The zero value finds the
// binary, keeps the data in a temporary directory and waits up to 60 s.
type Options struct {
	// Dir holds the generated config, data and logs. Empty means a temporary
	// directory that Stop removes.
	Dir string
	// Binary is the server executable. Empty means search PATH, then
	// /usr/sbin, /usr/bin and /usr/local/bin, for clickhouse-server (or the
	// single `clickhouse` binary, run as `clickhouse server`).
	Binary string
	// TCPPort fixes the native-protocol port (0: a free port). A fixed port
	// lets people use clickhouse-client without --port (talosd dev).
	TCPPort int
	// HTTPPort and InterserverPort fix those ports too (0: free ports): a
	// replica started again on its Dir with all three ports is where the
	// other replicas and ZooKeeper last saw it.
	HTTPPort, InterserverPort int
	// Replica makes the server one replica of a cluster (nil: a server
	// on its own).
	Replica *Replica
	// StartTimeout bounds the wait until the server answers SELECT 1
	// (default 60 s).
	StartTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL
	// (default 15 s).
	StopTimeout time.Duration
	// TLS also serves the native protocol over TLS on a port of its own
	// (SecureAddr), with a certificate for 127.0.0.1 and localhost signed
	// by a CA generated under Dir/tls (TLSFiles). The plaintext port stays.
	TLS bool
	// ClientCerts, with TLS, makes the secure port refuse clients that
	// present no certificate signed by that CA (TLSFiles has one).
	ClientCerts bool
	// Databases limits the writer and reader users to these databases
	// (allow_databases). Empty: every database, which the tests need (one
	// database per test).
	Databases []string
}

// Server is a private clickhouse-server process listening on 127.0.0.1.
type Server struct {
	dir        string
	tempDir    bool
	tcpPort    int
	securePort int      // 0 without Options.TLS
	tlsFiles   TLSFiles // zero without Options.TLS
	stopTO     time.Duration

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // the process's exit status; read after done

	stopOnce sync.Once
	stopErr  error
}

// Find returns the command line prefix that runs a ClickHouse
// server: [clickhouse-server] or [clickhouse, server]. It returns
// ErrNotFound when neither is installed.
func Find() ([]string, error) { return find(searchDirs) }

func find(dirs []string) ([]string, error) {
	for _, c := range []struct {
		name string
		args []string
	}{{"clickhouse-server", nil}, {"clickhouse", []string{"server"}}} {
		if p, err := exec.LookPath(c.name); err == nil {
			return append([]string{p}, c.args...), nil
		}
		for _, d := range dirs {
			p := filepath.Join(d, c.name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return append([]string{p}, c.args...), nil
			}
		}
	}
	return nil, ErrNotFound
}

// Start generates a config, starts clickhouse-server in its own
// process group (on Linux it is also killed if this process dies) and returns
// once the server answers SELECT 1 over the native protocol. The caller MUST
// call Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	argv := []string{opts.Binary}
	if opts.Binary == "" {
		var err error
		if argv, err = Find(); err != nil {
			return nil, err
		}
	} else if filepath.Base(opts.Binary) == "clickhouse" {
		argv = append(argv, "server")
	}
	if opts.Replica != nil {
		if err := opts.Replica.check(); err != nil {
			return nil, err
		}
	}
	startTO := opts.StartTimeout
	if startTO <= 0 {
		startTO = 60 * time.Second
	}
	stopTO := opts.StopTimeout
	if stopTO <= 0 {
		stopTO = 15 * time.Second
	}
	dir, temp := opts.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "talos-clickhouse-*")
		if err != nil {
			return nil, fmt.Errorf("chserver: clickhouse dir: %w", err)
		}
		dir, temp = d, true
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}

	// A port picked by listening on :0 can be taken by someone else before
	// the server binds it; retry a few times when the server exits early.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ch, err := startOnce(ctx, argv, dir, opts, startTO, stopTO)
		if err == nil {
			ch.tempDir = temp
			return ch, nil
		}
		lastErr = err
		if !errors.Is(err, errExitedEarly) || !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	if temp {
		os.RemoveAll(dir)
	}
	return nil, lastErr
}

var errExitedEarly = errors.New("clickhouse-server exited during start")

func startOnce(ctx context.Context, argv []string, dir string, opts Options, startTO, stopTO time.Duration) (*Server, error) {
	ports, err := FreePorts(4)
	if err != nil {
		return nil, fmt.Errorf("chserver: pick ports: %w", err)
	}
	for i, p := range []int{opts.TCPPort, opts.HTTPPort, opts.InterserverPort} {
		if p > 0 {
			ports[i] = p
		}
	}
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	c := config{dir: dir, tcp: ports[0], http: ports[1], interserver: ports[2], clientCerts: opts.ClientCerts, replica: opts.Replica}
	if opts.TLS {
		if c.tls, err = writeTLS(filepath.Join(dir, "tls")); err != nil {
			return nil, fmt.Errorf("chserver: tls: %w", err)
		}
		c.secure = ports[3]
	}
	cfg := filepath.Join(dir, "config.xml")
	if err := os.WriteFile(cfg, []byte(serverConfig(c)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersConfig(opts.Databases)), 0o644); err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(dir, "log", "stdout.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own descriptor

	args := append(append([]string{}, argv[1:]...), "--config-file="+cfg)
	cmd := exec.Command(argv[0], args...)
	cmd.Dir = dir
	cmd.Env = serverEnv(os.Environ())
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chserver: start %s: %w", argv[0], err)
	}
	ch := &Server{dir: dir, tcpPort: c.tcp, securePort: c.secure, tlsFiles: c.tls, stopTO: stopTO, cmd: cmd, done: make(chan struct{})}
	// The reaper is owned by ch: Stop waits for done.
	go func() {
		ch.err = cmd.Wait()
		close(ch.done)
	}()
	if err := ch.waitReady(ctx, startTO); err != nil {
		ch.kill()
		return nil, err
	}
	return ch, nil
}

// allocatorConf keeps the memory jemalloc (the allocator Debian's
// clickhouse-server links) frees instead of returning it to the kernel
// after a few seconds: every insert block is allocated and freed again,
// and where a page fault is dear (a virtual machine isolating page tables)
// the pages handed back are faulted in again; keeping them halved the
// server's CPU per call in `bash scripts/bench.sh ab` (BENCHMARKS.md).
// The price is the server's peak RSS, kept.
const allocatorConf = "dirty_decay_ms:-1,muzzy_decay_ms:-1"

// serverEnv is env with MALLOC_CONF set to allocatorConf, unless env
// already sets it (the operator's choice stands).
func serverEnv(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "MALLOC_CONF=") {
			return env
		}
	}
	return append(env, "MALLOC_CONF="+allocatorConf)
}

func (c *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-c.done:
			return fmt.Errorf("chserver: %w (%v)\n%s", errExitedEarly, c.err, c.logTail())
		case <-ctx.Done():
			return fmt.Errorf("chserver: clickhouse-server not ready after %s: %v (last: %v)\n%s", timeout, ctx.Err(), last, c.logTail())
		case <-tick.C:
		}
		if last = c.ping(ctx); last == nil {
			return nil
		}
	}
}

func (c *Server) ping(ctx context.Context) error {
	conn, err := c.Open("")
	if err != nil {
		return err
	}
	defer conn.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var one uint8
	return conn.QueryRow(pctx, "SELECT 1").Scan(&one)
}

// logTail is the end of the server's error log and stdout, for error messages.
func (c *Server) logTail() string {
	var b strings.Builder
	for _, name := range []string{"server.err.log", "stdout.log"} {
		data, err := os.ReadFile(filepath.Join(c.dir, "log", name))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		const max = 4096
		if len(data) > max {
			data = data[len(data)-max:]
		}
		fmt.Fprintf(&b, "--- tail of %s ---\n%s\n", filepath.Join(c.dir, "log", name), bytes.TrimSpace(data))
	}
	return b.String()
}

// Addr is the native-protocol address, 127.0.0.1:<tcp port>.
func (c *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.tcpPort)) }

// SecureAddr is the native-protocol-over-TLS address, 127.0.0.1:<port>,
// of a server started with Options.TLS ("" otherwise).
func (c *Server) SecureAddr() string {
	if c.securePort == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.securePort))
}

// TLSFiles are the CA and certificates of a server started with
// Options.TLS (zero otherwise).
func (c *Server) TLSFiles() TLSFiles { return c.tlsFiles }

// Dir is the directory holding the config, data and logs.
func (c *Server) Dir() string { return c.dir }

// Open connects to database ("" means the server's default database) as
// the administrator, AdminUser.
func (c *Server) Open(database string) (driver.Conn, error) { return OpenAddr(c.Addr(), database) }

// OpenAddr connects to database on the server at addr as the
// administrator, AdminUser, as Server.Open does; it does not dial until
// the first query, so it works for a server that is down.
func OpenAddr(addr, database string) (driver.Conn, error) {
	return clickhouse.Open(&clickhouse.Options{
		Addr:         []string{addr},
		Auth:         clickhouse.Auth{Database: database, Username: AdminUser},
		DialTimeout:  5 * time.Second,
		MaxOpenConns: 4,
		MaxIdleConns: 2,
	})
}

// Stop sends SIGTERM to the server's process group, waits up to the stop
// timeout, then sends SIGKILL; it removes the directory if Start
// created it. It is safe to call more than once.
func (c *Server) Stop() error {
	c.stopOnce.Do(func() {
		c.signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(c.stopTO):
			c.stopErr = fmt.Errorf("chserver: clickhouse-server did not stop within %s; killed", c.stopTO)
			c.kill()
		}
		if c.tempDir {
			if err := os.RemoveAll(c.dir); err != nil && c.stopErr == nil {
				c.stopErr = err
			}
		}
	})
	return c.stopErr
}

func (c *Server) kill() {
	c.signal(syscall.SIGKILL)
	<-c.done
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it.
// The data directory is kept (unless Start created it), so a new
// server started on the same Dir finds its data. Stop after Kill is a no-op.
func (c *Server) Kill() {
	c.stopOnce.Do(func() {
		c.kill()
		if c.tempDir {
			c.stopErr = os.RemoveAll(c.dir)
		}
	})
}

// Exited is closed once the server process has exited.
func (c *Server) Exited() <-chan struct{} { return c.done }

// config is what serverConfig writes: the directory, the ports and, with
// a secure port, the TLS files.
type config struct {
	dir                    string
	tcp, http, interserver int
	secure                 int // 0: no TLS
	tls                    TLSFiles
	clientCerts            bool
	replica                *Replica // nil: not a replica
}

func serverConfig(c config) string {
	p := func(sub string) string { return xmlEscape(filepath.Join(c.dir, sub)) + "/" }
	return fmt.Sprintf(`<?xml version="1.0"?>
<!-- Generated by talos testenv; private, loopback-only server. -->
<yandex>
  <logger>
    <level>warning</level>
    <log>%[1]sserver.log</log>
    <errorlog>%[1]sserver.err.log</errorlog>
    <size>10M</size>
    <count>2</count>
    <console>0</console>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <http_port>%[3]d</http_port>
  <interserver_http_port>%[4]d</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>%[5]s</path>
  <tmp_path>%[6]s</tmp_path>
  <user_files_path>%[7]s</user_files_path>
  <format_schema_path>%[8]s</format_schema_path>
  <users_config>%[9]s</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <max_concurrent_queries>100</max_concurrent_queries>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <timezone>UTC</timezone>
  <query_log>
    <database>system</database>
    <table>query_log</table>
    <flush_interval_milliseconds>7500</flush_interval_milliseconds>
  </query_log>
%[10]s%[11]s</yandex>
`, p("log"), c.tcp, c.http, c.interserver, p("data"), p("tmp"), p("user_files"), p("format_schemas"),
		xmlEscape(filepath.Join(c.dir, "users.xml")), tlsConfig(c), replicaConfig(c.replica))
}

// tlsConfig is the secure native port and its OpenSSL server section
// (empty without a secure port). With clientCerts the server verifies
// client certificates against the CA and requires one (strict).
func tlsConfig(c config) string {
	if c.secure == 0 {
		return ""
	}
	mode := "none"
	if c.clientCerts {
		mode = "strict"
	}
	return fmt.Sprintf(`  <tcp_port_secure>%d</tcp_port_secure>
  <openSSL>
    <server>
      <certificateFile>%s</certificateFile>
      <privateKeyFile>%s</privateKeyFile>
      <caConfig>%s</caConfig>
      <verificationMode>%s</verificationMode>
      <loadDefaultCAFile>false</loadDefaultCAFile>
      <cacheSessions>true</cacheSessions>
      <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
      <preferServerCiphers>true</preferServerCiphers>
    </server>
  </openSSL>
`, c.secure, xmlEscape(c.tls.ServerCert), xmlEscape(c.tls.ServerKey), xmlEscape(c.tls.CA), mode)
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// FreePorts returns n distinct loopback ports that were free a moment ago,
// for servers started next (this package's, and the test environment's).
// They are picked at random below the kernel's ephemeral port range
// (ip_local_port_range, 32768 if it cannot be read), which a port the
// kernel hands out (an outgoing connection, a listen on port 0) never is:
// such a port, free a moment ago, may be taken by the time the server
// binds it, and a node restarted on its old port would find it in use.
func FreePorts(n int) ([]int, error) {
	low := ephemeralLow()
	ports := make([]int, 0, n)
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000*n {
			return nil, fmt.Errorf("no %d free loopback ports below %d", n, low)
		}
		p := low/2 + rand.IntN(low-low/2)
		if seen[p] {
			continue
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low >= 2048 {
				return low
			}
		}
	}
	return 32768
}
