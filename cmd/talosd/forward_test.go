package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/loadgen"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// fwdStack is talosd running every pipeline role and the forward role,
// whose one destination is a real rsyslog over TLS (RFC 5425), on a fresh
// NATS and ClickHouse database.
type fwdStack struct {
	rs      *testenv.Rsyslog
	nc      *nats.Conn
	natsURL string
	conn    driver.Conn
	db      string
	keys    verify.KeySet
	httpURL string
	webURL  string // the dashboard's incidents page (token fwdWebToken)
}

func startForwardStack(t *testing.T, alertAfter string) *fwdStack {
	t.Helper()
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	certs := testenv.NewTLSFiles(t, t.TempDir())
	s := &fwdStack{rs: testenv.StartRsyslog(t, testenv.RsyslogOptions{TLS: certs}), natsURL: ns.URL(), db: db, keys: verify.KeySet{}}
	s.keys.Add(writeKeyPair(t, dir, "signer").Public())
	cfg := fmt.Sprintf(`{"destinations": [{"name": "rsyslog", "type": "syslog", "address": %q, "tls": {"ca_file": %q}, "alert_after": %q}]}`,
		s.rs.Addr(), certs.CAFile, alertAfter)
	if err := os.WriteFile(filepath.Join(dir, "forward.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := testenv.FreeAddr(t)
	s.httpURL = "http://" + httpAddr
	webAddr := testenv.FreeAddr(t)
	s.webURL = "http://" + webAddr + "/incidents"
	_, stop := startTalosdLog(t, bin, filepath.Join(dir, "talosd.log"), "--data-dir", filepath.Join(dir, "data"), "--nats-url", ns.URL(),
		"--clickhouse-addr", addr, "--clickhouse-database", db, "--registry", "demo/registry", "--signing-key", filepath.Join(dir, "signer.key"),
		"--roles", "enforce,sink,control,forward,web", "--forward-config", filepath.Join(dir, "forward.json"), "--http-addr", httpAddr,
		"--web-addr", webAddr, "--web-token", fwdWebToken,
		"--instance", "fwd-e2e", "--chains", "4", "--batch-age", "200ms")
	t.Cleanup(stop)
	s.nc, _ = testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if s.conn, err = query.Open(ctx, addr, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	return s
}

// load sends calls (each with its post event) at rate calls/s (0: as fast
// as decisions come back) from 20 enforcement points, and one control
// command, which leaves a control receipt.
func (s *fwdStack) load(t *testing.T, calls, rate int) *loadgen.Tally {
	clients, closeAll, err := loadgen.Connect(2, 20, "fwd", func() (*nats.Conn, error) { return nats.Connect(s.natsURL) })
	defer closeAll()
	if err != nil {
		t.Error(err)
		return nil
	}
	m, err := loadgen.NewMaker("files", "list_directory", "fwd-run", 2048, true)
	if err != nil {
		t.Error(err)
		return nil
	}
	p, err := loadgen.Prepare(m, clients, calls, 0)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer p.Stop()
	tally := p.Send(clients, loadgen.Pacing{Rate: rate, Inflight: 4, Server: "files", Timeout: time.Minute})
	if _, err := s.nc.Request(schemas.CtlSubject(schemas.VerbStatus), []byte(`{}`), 10*time.Second); err != nil {
		t.Errorf("control command: %v", err)
	}
	if tally.None != 0 || tally.Allowed+tally.Denied != int64(calls) || tally.Posted != tally.Allowed {
		t.Errorf("load: %+v", tally)
	}
	return tally
}

// stored is what ClickHouse holds: each signed record by id, per table.
type stored map[string]map[string][]byte

func (s *fwdStack) stored(t *testing.T) stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := stored{}
	for table, id := range map[string]string{"receipts": "receipt_id", "tool_calls": "event_id", "checkpoints": "checkpoint_id"} {
		rows, err := s.conn.Query(ctx, "SELECT "+id+", any(cloudevent) FROM `"+s.db+"`."+table+" GROUP BY "+id)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = map[string][]byte{}
		for rows.Next() {
			var k, ce string
			if err := rows.Scan(&k, &ce); err != nil {
				t.Fatal(err)
			}
			out[table][k] = []byte(ce)
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// lineRe is a line of rsyslog's file: PRI, kind, id and the CloudEvent.
var lineRe = regexp.MustCompile(`^(\d+) \S+ fwd-e2e talos - (\S+) \[talos@32473 id="([^"]+)"[^\n]*?"\] (\{.*\})$`)

// tornIDRe finds the event id on a line a crash tore.
var tornIDRe = regexp.MustCompile(`\[talos@32473 id="([^"]+)"`)

// received reads rsyslog's file: each message's CloudEvents by the id of
// its structured data, checking the header rsyslog parsed.
func (s *fwdStack) received(t *testing.T) (byID map[string][][]byte, kinds map[string]string, lines int) {
	t.Helper()
	byID, kinds = map[string][][]byte{}, map[string]string{}
	for _, l := range s.rs.Lines(t) {
		m := lineRe.FindSubmatch(l)
		if m == nil {
			t.Fatalf("rsyslog line not as sent: %.300q", l)
		}
		byID[string(m[3])] = append(byID[string(m[3])], m[4])
		kinds[string(m[3])] = string(m[2])
		lines++
	}
	return byID, kinds, lines
}

// waitEveryEvent waits until ClickHouse holds the receipts and
// ToolCallEvents of the run, then until rsyslog's file holds every record
// ClickHouse has, and checks what the issue asks: the set of receipt ids
// in the file equals ClickHouse's; each id's messages are the stored
// CloudEvent byte for byte (so a duplicate carries its id); and what
// rsyslog holds verifies, chains and checkpoints included, with the
// signer's public key alone.
func (s *fwdStack) waitEveryEvent(t *testing.T, receiptCount, toolCalls int) (duplicates int) {
	t.Helper()
	var st stored
	waitFor(t, 3*time.Minute, func() string {
		st = s.stored(t)
		if len(st["receipts"]) >= receiptCount && len(st["tool_calls"]) >= toolCalls {
			return ""
		}
		return fmt.Sprintf("ClickHouse holds %d receipts and %d ToolCallEvents, want %d and %d", len(st["receipts"]), len(st["tool_calls"]), receiptCount, toolCalls)
	})
	var (
		byID  map[string][][]byte
		kinds map[string]string
		lines int
	)
	waitFor(t, 3*time.Minute, func() string {
		byID, kinds, lines = s.received(t)
		missing := map[string]int{}
		example := ""
		for table, ids := range st {
			for id := range ids {
				if byID[id] == nil {
					missing[table]++
					example = id
				}
			}
		}
		if len(missing) == 0 {
			return ""
		}
		raw, _ := os.ReadFile(s.rs.File())
		return fmt.Sprintf("rsyslog lacks %v of ClickHouse's records (e.g. %s, in the file's bytes: %v); forward lag %v, resent %v",
			missing, example, bytes.Contains(raw, []byte(example)), s.metric(t, "talos_forward_lag"), s.metric(t, "talos_forward_resent_total"))
	})
	if len(st["receipts"]) != receiptCount || len(st["tool_calls"]) != toolCalls {
		t.Fatalf("ClickHouse: %d receipts, %d ToolCallEvents; want %d and %d", len(st["receipts"]), len(st["tool_calls"]), receiptCount, toolCalls)
	}
	receiptIDs := 0
	var raws [][]byte
	for id, msgs := range byID {
		if strings.HasPrefix(kinds[id], "receipt.") {
			receiptIDs++
			if st["receipts"][id] == nil {
				t.Errorf("rsyslog holds receipt %s, which ClickHouse does not", id)
			}
		}
		for _, m := range msgs[1:] {
			if !bytes.Equal(m, msgs[0]) {
				t.Fatalf("event %s arrived twice with different content", id)
			}
		}
		for _, table := range st {
			if ce := table[id]; ce != nil && !bytes.Equal(ce, msgs[0]) {
				t.Fatalf("event %s in rsyslog differs from ClickHouse's:\n%s\n%s", id, msgs[0], ce)
			}
		}
		raws = append(raws, msgs[0])
	}
	if receiptIDs != len(st["receipts"]) {
		t.Fatalf("rsyslog holds %d receipt ids, ClickHouse %d", receiptIDs, len(st["receipts"]))
	}
	// A line rsyslog was writing when it was killed is torn; the event
	// on it must have arrived whole as well.
	for _, torn := range s.rs.Torn(t) {
		if m := tornIDRe.FindSubmatch(torn); m != nil && byID[string(m[1])] == nil {
			t.Fatalf("event %s reached rsyslog only on the line its crash tore: %.300q", m[1], torn)
		}
	}
	if rep := verify.VerifyFile(raws, s.keys, false, true); !rep.OK() {
		t.Fatalf("what rsyslog received does not verify: %d problems, first %+v", len(rep.Problems), rep.Problems[0])
	}
	return lines - len(byID)
}

// fwdWebToken is the forward stack's dashboard token.
const fwdWebToken = "forward-test-dashboard-token"

// waitFor polls cond every 200 ms until it returns "" and fails the test
// with its last answer after d.
func waitFor(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metric reads one series of talosd's /metrics.
func (s *fwdStack) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name+`{destination="rsyslog"}`) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no %s:\n%s", name, b)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestForwardEveryEventToRsyslog (issue 23, must-show 3): every signed
// event of a 20,000-call run (pre and post: two receipts and a
// ToolCallEvent each, checkpoints, a control receipt) reaches rsyslog over
// TLS, byte for byte, and verifies there.
func TestForwardEveryEventToRsyslog(t *testing.T) {
	const calls = 20000
	s := startForwardStack(t, "5m")
	tally := s.load(t, calls, 0)
	if tally == nil {
		t.FailNow()
	}
	dups := s.waitEveryEvent(t, int(calls+tally.Posted+1), calls)
	t.Logf("%d calls forwarded; %d duplicate messages", calls, dups)
	testenv.WaitFor(t, 10*time.Second, func() bool { return s.metric(t, "talos_forward_lag") == 0 })
	if s.metric(t, "talos_forward_events_total") < 3*calls || s.metric(t, "talos_forward_up") != 1 {
		t.Fatal("forward metrics do not show the run")
	}
}

// TestForwardSurvivesRsyslogCrash (must-show 3): rsyslog killed with
// SIGKILL mid-run and started again 30 s later still gets every event;
// duplicates carry the same id and bytes. Meanwhile the forwarder reports
// the destination down in /metrics and, past its 5 s alert limit, on
// talos.status.alert.forward.rsyslog; it reports it resolved after.
func TestForwardSurvivesRsyslogCrash(t *testing.T) {
	const calls, rate = 9000, 200 // 45 s of calls: the crash falls inside the run
	s := startForwardStack(t, "5s")
	alerts := make(chan *nats.Msg, 64)
	sub, err := s.nc.ChanSubscribe(schemas.ForwardAlertSubject("rsyslog"), alerts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	done := make(chan *loadgen.Tally, 1)
	go func() { done <- s.load(t, calls, rate) }()

	testenv.WaitFor(t, time.Minute, func() bool { return len(s.rs.Lines(t)) >= 1000 })
	s.rs.Kill()
	killed := time.Now()
	select {
	case <-done:
		t.Fatal("the run ended before rsyslog was killed")
	default:
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { return s.metric(t, "talos_forward_up") == 0 })
	var down schemas.ForwardAlert
	select {
	case m := <-alerts:
		if err := json.Unmarshal(m.Data, &down); err != nil || down.State != schemas.AlertDown || down.Instance != "fwd-e2e" {
			t.Fatalf("alert %s (%v)", m.Data, err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("no down alert within 25 s of the crash (alert_after 5s)")
	}
	// The dashboard's incidents page shows the destination down, and behind.
	s.dashboardShows(t, `data-destination="rsyslog"`, `data-state="down"`, "failures")
	if page := s.dashboard(t); strings.Contains(page, `data-lag="0"`) {
		t.Error("the dashboard shows rsyslog 0 events behind while it is down")
	}
	time.Sleep(time.Until(killed.Add(30 * time.Second)))
	s.rs.Start(t)
	tally := <-done
	if tally == nil {
		t.FailNow()
	}
	dups := s.waitEveryEvent(t, int(calls+tally.Posted+1), calls)
	t.Logf("down alert after %d ms (%d failures); %d duplicate messages after the restart, %d lines torn by the crash", down.DownMS, down.Failures, dups, len(s.rs.Torn(t)))
	for resolved := false; !resolved; {
		select {
		case m := <-alerts:
			resolved = strings.Contains(string(m.Data), `"state":"resolved"`)
		case <-time.After(20 * time.Second):
			t.Fatal("no resolved alert after the restart")
		}
	}
	if s.metric(t, "talos_forward_up") != 1 || s.metric(t, "talos_forward_failures_total") == 0 || s.metric(t, "talos_forward_alerts_total") == 0 {
		t.Fatal("forward metrics do not show the outage")
	}
	s.dashboardShows(t, `data-destination="rsyslog"`, `data-state="resolved"`, `data-lag="0"`)
}

// dashboard is the incidents page of the stack's dashboard.
func (s *fwdStack) dashboard(t *testing.T) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.webURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+fwdWebToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the incidents page: %d %v\n%s", resp.StatusCode, err, b)
	}
	return string(b)
}

// dashboardShows waits (20 s at most) until the incidents page holds every
// one of want.
func (s *fwdStack) dashboardShows(t *testing.T, want ...string) {
	t.Helper()
	waitFor(t, 20*time.Second, func() string {
		page := s.dashboard(t)
		for _, w := range want {
			if !strings.Contains(page, w) {
				return "the incidents page lacks " + w
			}
		}
		return ""
	})
}

// TestForwardUsageErrors: the forward role without its configuration, or
// with a destination that is wrong, exits 2 naming the fix.
func TestForwardUsageErrors(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	dir := t.TempDir()
	bad := filepath.Join(dir, "forward.json")
	if err := os.WriteFile(bad, []byte(`{"destinations": [{"name": "siem", "type": "syslog", "address": "siem.example"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "needs --forward-config"},
		{[]string{"--forward-config", bad}, `destination siem: address "siem.example"`},
	} {
		args := append([]string{"--roles", "forward", "--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http-addr", ""}, c.args...)
		out, err := testenv.Command(bin, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("talosd %v: %v, want exit 2 naming %q\n%s", args, err, c.want, out)
		}
	}
}
