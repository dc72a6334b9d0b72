//go:build unix

package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvToolsCache names the directory where the tests keep the tools they
// build, such as the OpenTelemetry Collector (default: talos/ in the user's
// cache directory, os.UserCacheDir). It is outside the checkout so every
// test binary, worktree and CI run on the machine shares one build.
const EnvToolsCache = "TALOS_TOOLS_CACHE"

// otelcolSources are the files of testenv/otelcol that decide the build;
// the cache directory is named after their digest, so changing a version
// builds a new collector.
var otelcolSources = []string{"go.mod", "go.sum", "main.go"}

// OTelCollectorBinary returns the path of the OpenTelemetry Collector built
// from testenv/otelcol (the OTLP receiver and the file exporter). It is
// built once per machine (buildTools); the first build takes about two
// minutes and needs the collector's modules (from the module proxy, or the
// module cache).
func OTelCollectorBinary() (string, error) {
	bins, err := buildTools("otelcol", otelcolSources, "the OpenTelemetry Collector (about 2 minutes)", map[string]string{"otelcol": "."})
	if err != nil {
		return "", err
	}
	return bins["otelcol"], nil
}

// buildTools returns the programs of the module testenv/<module>, each
// name of pkgs built from its package (a directory of the module, or an
// import path it requires). They are built once per machine, into
// $TALOS_TOOLS_CACHE or the user's cache directory, in a directory named
// after the digest of the module's sources, under an exclusive file lock,
// so test binaries that ask at the same time wait for one build rather
// than each doing their own.
func buildTools(module string, sources []string, what string, pkgs map[string]string) (map[string]string, error) {
	src, err := sourceDir(module)
	if err != nil {
		return nil, fmt.Errorf("testenv: cannot find testenv/%s (%v): run the tests from this repository", module, err)
	}
	key, err := digestFiles(src, sources)
	if err != nil {
		return nil, fmt.Errorf("testenv: %s sources: %w", module, err)
	}
	cache, err := toolsCache()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, module+"-"+key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("testenv: tools cache: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	bins, said := map[string]string{}, false
	for name, pkg := range pkgs {
		bin := filepath.Join(dir, name)
		bins[name] = bin
		if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
			continue
		}
		if !said {
			fmt.Fprintf(os.Stderr, "building %s for the tests (once per machine)...\n", what)
			said = true
		}
		if err := buildInto(src, pkg, dir, bin); err != nil {
			return nil, err
		}
	}
	return bins, nil
}

// toolsCache is $TALOS_TOOLS_CACHE, else talos/ in the user's cache
// directory.
func toolsCache() (string, error) {
	if d := os.Getenv(EnvToolsCache); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testenv: no cache directory for the tools the tests build (%v): set %s", err, EnvToolsCache)
	}
	return filepath.Join(d, "talos"), nil
}

// digestFiles is a short sha256 of the names and contents of files in dir.
func digestFiles(dir string, files []string) (string, error) {
	h := sha256.New()
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// lockDir takes the exclusive lock of dir (flock on dir/lock), waiting for
// another process that holds it; unlock releases it. The kernel releases
// it too when the holder dies, so a killed build blocks no one.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: tools cache lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("testenv: lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

// buildInto builds the main package pkg of the module in src to a
// temporary file in dir and renames it to bin, so bin is never a partly
// written program. It must be called with dir locked: any temporary file
// there is a killed build's.
func buildInto(src, pkg, dir, bin string) error {
	stale, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	for _, p := range stale {
		_ = os.Remove(p)
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(bin)+"-*.tmp")
	if err != nil {
		return fmt.Errorf("testenv: tools cache: %w", err)
	}
	tmp.Close()
	cmd := exec.Command("go", "build", "-C", src, "-o", tmp.Name(), pkg)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("testenv: go build -C %s: %v\n%s", src, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("testenv: tools cache: %w", err)
	}
	return nil
}

// OTelCollector is a private OpenTelemetry Collector as the OTLP endpoint
// a user points Talos at: OTLP/gRPC and OTLP/HTTP on loopback ports, every
// span it receives written to a JSON file (one OTLP
// ExportTraceServiceRequest a line, flushed every 100 ms) that Spans and
// Raw read.
type OTelCollector struct {
	dir, conf, out string
	grpcPort       int
	httpPort       int

	proc child
}

// StartOTelCollector starts the collector (building it first if this
// machine has not, see OTelCollectorBinary) and waits until both its ports
// accept connections; it is stopped when the test ends.
func StartOTelCollector(t testing.TB) *OTelCollector {
	t.Helper()
	bin, err := OTelCollectorBinary()
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 2)
	grpcPort, httpPort := ports[0], ports[1]
	dir := t.TempDir()
	c := &OTelCollector{dir: dir, conf: filepath.Join(dir, "otelcol.yaml"), out: filepath.Join(dir, "spans.json"),
		grpcPort: grpcPort, httpPort: httpPort, proc: child{name: "the OpenTelemetry Collector", log: filepath.Join(dir, "otelcol.log")}}
	if err := os.WriteFile(c.conf, []byte(otelcolConfig(grpcPort, httpPort, c.out)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.proc.signal(syscall.SIGTERM, 10*time.Second) })
	c.proc.start(t, 30*time.Second, []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)),
		net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort))}, bin, "--config", c.conf)
	return c
}

// otelcolConfig is the generated configuration: one traces pipeline from
// the OTLP receiver to the file exporter, and none of the collector's own
// telemetry (which would listen on a fixed port).
func otelcolConfig(grpcPort, httpPort int, out string) string {
	var b strings.Builder
	b.WriteString("# Generated by talos testenv: a private, loopback-only OTLP receiver.\n")
	b.WriteString("receivers:\n  otlp:\n    protocols:\n")
	fmt.Fprintf(&b, "      grpc: {endpoint: \"127.0.0.1:%d\"}\n", grpcPort)
	fmt.Fprintf(&b, "      http: {endpoint: \"127.0.0.1:%d\"}\n", httpPort)
	fmt.Fprintf(&b, "exporters:\n  file: {path: %s, flush_interval: 100ms}\n", strconv.Quote(out))
	b.WriteString("service:\n  telemetry: {metrics: {level: none}}\n")
	b.WriteString("  pipelines:\n    traces: {receivers: [otlp], exporters: [file]}\n")
	return b.String()
}

// HTTPEndpoint is the OTLP/HTTP endpoint, http://127.0.0.1:PORT: the
// OTEL_EXPORTER_OTLP_ENDPOINT for the default protocol, http/protobuf.
func (c *OTelCollector) HTTPEndpoint() string { return "http://127.0.0.1:" + strconv.Itoa(c.httpPort) }

// GRPCEndpoint is the OTLP/gRPC endpoint, http://127.0.0.1:PORT: the
// OTEL_EXPORTER_OTLP_ENDPOINT for the protocol grpc.
func (c *OTelCollector) GRPCEndpoint() string { return "http://127.0.0.1:" + strconv.Itoa(c.grpcPort) }

// Env is the environment that points a child process's OTLP exporter at
// the collector with protocol ("grpc", or "" for http/protobuf), to append
// to os.Environ(): OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL
// and OTEL_EXPORTER_OTLP_INSECURE=true. Signal-specific variables
// (OTEL_EXPORTER_OTLP_TRACES_*) already in the environment win over these.
func (c *OTelCollector) Env(protocol string) []string {
	endpoint := c.HTTPEndpoint()
	switch protocol {
	case "":
		protocol = "http/protobuf"
	case "grpc":
		endpoint = c.GRPCEndpoint()
	}
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
		"OTEL_EXPORTER_OTLP_INSECURE=true",
	}
}

// Raw is the whole file the collector has written so far (nil before the
// first span), for a scan of everything exported, such as for a secret
// that must not leave the process.
func (c *OTelCollector) Raw(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(c.out)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Spans are the spans the collector has written so far, in the order it
// wrote them (a line being written is left out).
func (c *OTelCollector) Spans(t testing.TB) []Span {
	t.Helper()
	b := c.Raw(t)
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		return nil
	}
	spans, err := parseOTLPLines(b[:i])
	if err != nil {
		t.Fatalf("testenv: %s: %v", c.out, err)
	}
	return spans
}

// WaitSpans polls Spans until done holds for them and returns them; at
// timeout it fails the test, listing the spans it had.
func (c *OTelCollector) WaitSpans(t testing.TB, timeout time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := c.Spans(t)
		if done(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, s := range spans {
				fmt.Fprintf(&b, "\n  %s", s)
			}
			t.Fatalf("testenv: the spans the collector received did not satisfy the test within %s; %d spans:%s",
				timeout, len(spans), b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
