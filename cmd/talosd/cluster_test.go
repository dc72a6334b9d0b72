package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestReplicasOnCluster (issue 17): talosd --replicas 3 on a three-node
// NATS cluster gives every stream, every KV bucket (the call ledger and
// the rate counters of a --policy with rate limits) and every durable
// consumer three replicas. A second talosd that joins through another
// node without the flag lowers none of them, and calls sent through
// either node are decided.
func TestReplicasOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two talosd on a NATS cluster")
	}
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	cluster := testenv.NATSClusterForTest(t, testenv.NATSClusterOptions{})
	addr, db := testenv.NewDatabase(t)
	dir := t.TempDir()
	writeKeyPair(t, dir, "signer")
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"rate_limits":[{"name":"per-agent","agents":["*"],"servers":["*"],"tools":["*"],"limit":100000,"window":"1m"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--registry", "demo/registry", "--signing-key", filepath.Join(dir, "signer.key"), "--policy", policy,
		"--http-addr", "", "--log-format", "json"}
	first := append([]string{"--instance", "first", "--data-dir", filepath.Join(dir, "first"), "--nats-url", cluster.URLs(), "--replicas", "3",
		"--clickhouse-addr", addr, "--clickhouse-database", db}, common...)
	second := append([]string{"--instance", "second", "--data-dir", filepath.Join(dir, "second"), "--nats-url", cluster.NodeURL(2),
		"--roles", "enforce,control"}, common...)

	nc, js := testenv.ConnectJS(t, cluster.NodeURL(1))
	live := watchWorkers(t, nc)
	startTalosdLog(t, bin, filepath.Join(dir, "first.log"), first...)
	testenv.WaitFor(t, 60*time.Second, func() bool { return live("first") && consumersExist(js) })
	startTalosdLog(t, bin, filepath.Join(dir, "second.log"), second...)
	testenv.WaitFor(t, 60*time.Second, func() bool { return live("second") })

	checkReplicas(t, js, cluster, 3)
	for _, node := range []int{0, 2} {
		cnc, cjs := testenv.ConnectJS(t, cluster.NodeURL(node))
		client, err := ep.NewClient(cnc, cjs, "talosctl")
		if err != nil {
			t.Fatal(err)
		}
		call, err := ep.NewCall("talosctl", "files", "read_file", map[string]any{"path": "README.md"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		d, err := client.Call(ctx, call)
		cancel()
		if err != nil {
			t.Fatalf("call through node %d: %v", node, err)
		}
		if d.Decision != schemas.DecisionAllow {
			t.Fatalf("call through node %d: %s %v", node, d.Decision, d.ReasonCodes)
		}
	}
}

// watchWorkers reports whether a worker's heartbeat was seen.
func watchWorkers(t *testing.T, nc *nats.Conn) func(id string) bool {
	t.Helper()
	seen := make(chan string, 64)
	sub, err := nc.Subscribe(schemas.SubjectStatusAll, func(m *nats.Msg) {
		select {
		case seen <- strings.TrimPrefix(m.Subject, "talos.status."):
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	got := map[string]bool{}
	return func(id string) bool {
		for {
			select {
			case w := <-seen:
				got[w] = true
			default:
				return got[id]
			}
		}
	}
}

// consumersExist reports whether the durable consumers of the enforce,
// sink and control roles have been created.
func consumersExist(js jetstream.JetStream) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for stream, name := range map[string]string{
		schemas.StreamCalls: "talos-enforce", schemas.StreamAudit: "talos-sink", schemas.StreamControl: "talos-control-audit",
	} {
		if _, err := js.Consumer(ctx, stream, name); err != nil {
			return false
		}
	}
	return true
}

// checkReplicas checks that every Talos stream and bucket, and every
// durable consumer on them, has want replicas, each placed on a node.
func checkReplicas(t *testing.T, js jetstream.JetStream, cluster *testenv.NATSCluster, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wantStreams := map[string]bool{schemas.StreamCalls: false, schemas.StreamAudit: false, schemas.StreamControl: false, schemas.StreamDecisions: false,
		"KV_TALOS_LEDGER": false, "KV_TALOS_RATE": false}
	durables := 0
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := wantStreams[name]; !ok {
			continue
		}
		wantStreams[name] = true
		if err := placed(st.CachedInfo().Config.Replicas, st.CachedInfo().Cluster, cluster, want); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
		for ci := range st.ListConsumers(ctx).Info() {
			if ci.Config.Durable == "" {
				continue
			}
			durables++
			// A durable consumer inherits the stream's replicas (0).
			if err := placed(max(ci.Config.Replicas, st.CachedInfo().Config.Replicas), ci.Cluster, cluster, want); err != nil || ci.Config.Replicas != 0 {
				t.Errorf("consumer %s of %s: replicas %d: %v", ci.Name, name, ci.Config.Replicas, err)
			}
		}
	}
	if names.Err() != nil {
		t.Fatal(names.Err())
	}
	for name, ok := range wantStreams {
		if !ok {
			t.Errorf("stream %s is missing", name)
		}
	}
	if durables < 3 {
		t.Errorf("%d durable consumers, want the enforce, sink and control ones", durables)
	}
}

// placed checks a configured replica count and the cluster info of a
// stream or consumer: a leader and want-1 other replicas, all on known
// nodes.
func placed(replicas int, ci *jetstream.ClusterInfo, cluster *testenv.NATSCluster, want int) error {
	if replicas != want {
		return fmt.Errorf("%d replicas configured, want %d", replicas, want)
	}
	if ci == nil || cluster.Index(ci.Leader) < 0 || len(ci.Replicas) != want-1 {
		return fmt.Errorf("placed on %+v, want a leader and %d replicas", ci, want-1)
	}
	for _, p := range ci.Replicas {
		if cluster.Index(p.Name) < 0 {
			return fmt.Errorf("replica on unknown node %q", p.Name)
		}
	}
	return nil
}
