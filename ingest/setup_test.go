package ingest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/retry"
	"github.com/talos-audit/talos/testenv"
)

// TestEnsureStreamsMisconfigured: what waiting cannot fix fails at once
// with a clear error rather than being retried like a cluster electing
// leaders: three replicas asked of a server without a cluster, and a user
// that may not use the JetStream API.
func TestEnsureStreamsMisconfigured(t *testing.T) {
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: t.TempDir(), Users: []*server.User{
		{Username: "talosd", Password: "p1"},
		{Username: "ep", Password: "p2", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"talos.call.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, user, password string
		replicas             int
		want                 string
	}{
		{"replicas without a cluster", "talosd", "p1", 3, "replicas > 1 not supported in non-clustered mode"},
		{"no JetStream API permission", "ep", "p2", 1, "permissions violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(ns.URL(), nats.UserInfo(tc.user, tc.password))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			began := time.Now()
			err = ingest.EnsureStreams(ctx, js, ingest.StreamOptions{Replicas: tc.replicas})
			if !errors.Is(err, retry.ErrMisconfigured) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %v naming %q", err, retry.ErrMisconfigured, tc.want)
			}
			if ctx.Err() != nil {
				t.Fatal("waited for the deadline instead of failing")
			}
			t.Logf("failed after %v: %v", time.Since(began).Round(time.Millisecond), err)
		})
	}
}

// TestEnsureStreamsMoreReplicasThanNodes: five replicas asked of a
// three-node cluster cannot be placed; a cluster still starting could not
// place them either, so the error is waited out for the grace, then named
// a misconfiguration.
func TestEnsureStreamsMoreReplicasThanNodes(t *testing.T) {
	cluster := testenv.NATSClusterForTest(t, testenv.NATSClusterOptions{})
	_, js := testenv.ConnectJS(t, cluster.NodeURL(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{Replicas: 5, Setup: retry.SetupOptions{Grace: 2 * time.Second}})
	if !errors.Is(err, retry.ErrMisconfigured) || !strings.Contains(err.Error(), "more replicas than the cluster has") {
		t.Fatalf("err %v, want %v naming the replicas", err, retry.ErrMisconfigured)
	}
	if ctx.Err() != nil {
		t.Fatal("waited for the deadline instead of failing")
	}
	t.Log(err)
}
