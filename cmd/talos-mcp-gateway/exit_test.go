package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/testenv"
)

// lingerEnv, set in a stdio upstream's environment, makes this test
// binary that upstream (TestMain): lingeringUpstream.
const lingerEnv = "GATEWAY_TEST_LINGERING_UPSTREAM"

// lingeringUpstream serves MCP on stdin and stdout and, like some servers
// with timers of their own, keeps running after its stdin closes, until
// it is killed, or for two minutes: long past what the test waits for,
// short enough that a gateway which fails to end it leaves nothing behind
// for long.
func lingeringUpstream() {
	s := mcp.NewServer(&mcp.Implementation{Name: "lingering", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "lingering_noop"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
	time.Sleep(2 * time.Minute)
	os.Exit(0)
}

// lingeringGateway is a gateway, as ep epID, over server-everything and a
// lingering upstream.
func (s *stack) lingeringGateway(t *testing.T, epID string) *exec.Cmd {
	cmd := testenv.Command(s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", s.registry,
		"--trusted-keys", filepath.Join(s.dir, "worker.pub"), "--ep-id", epID,
		"--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"), "--upstream", "lingering="+os.Args[0])
	cmd.Env = append(os.Environ(), lingerEnv+"=1")
	return cmd
}

// TestUpstreamsEndWithGateway, with an upstream that ignores its closed
// stdin:
//   - once its client closes stdin, the gateway exits within about 2 s
//     (an MCP client waits little longer before it signals, then kills)
//     and takes its stdio upstreams with it; the post event of the last
//     call still reaches Talos;
//   - a gateway killed outright (SIGKILL, as a client does when the
//     gateway lingers) leaves no stdio upstream running.
func TestUpstreamsEndWithGateway(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// start runs a gateway as ep epID, makes a call, and returns it, the
	// call's id and its upstreams' process ids.
	start := func(epID string) (*exec.Cmd, *gatewaySession, string, []int) {
		cmd := s.lingeringGateway(t, epID)
		gw := s.connectGateway(ctx, cmd)
		res := gw.call(ctx, "echo", map[string]any{"message": "last"}).mustAllow(t, "echo")
		id, _ := res.Meta[gateway.MetaToolCallID].(string)
		ups := children(t, cmd.Process.Pid)
		if len(ups) != 2 {
			t.Fatalf("the gateway runs %d child processes, want its 2 stdio upstreams", len(ups))
		}
		return cmd, gw, id, ups
	}
	gone := func(ups []int) bool {
		for _, pid := range ups {
			if running(pid) {
				return false
			}
		}
		return true
	}

	cmd, gw, id, ups := start("gw-exit")
	began := time.Now()
	_ = gw.cs.Close() // closes the gateway's stdin and waits for it to exit
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("the gateway took %v to exit after its stdin closed, want about 2 s at most", took.Round(time.Millisecond))
	}
	if st := cmd.ProcessState; st == nil || !st.Exited() {
		t.Fatalf("the gateway did not exit by itself: %v", st)
	}
	if !gone(ups) {
		t.Errorf("upstream processes %v outlived the gateway", ups)
	}
	waitReceipts(t, s, "post receipt of the last call", "SELECT count() FROM "+query.ViewReceipts+" WHERE tool_call_id = ? AND phase = 'post'", id)

	cmd, _, _, ups = start("gw-kill")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() bool { return gone(ups) })
}

// children are the ids of the processes whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != "Z"
}

// procStat is the parent id and state of process pid, from /proc.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}
