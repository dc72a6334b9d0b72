package chserver

import (
	"context"
	"encoding/xml"
	"strings"
	"testing"
)

// TestReplicaConfig: a replica's config is well-formed XML with ZooKeeper,
// its macros, the cluster's one shard listing every replica, and
// distributed DDL; a server that is no replica gets none of it; a
// replica missing a part, or named so its cluster would be no XML tag or
// DDL name, is refused before anything starts.
func TestReplicaConfig(t *testing.T) {
	r := &Replica{ZooKeeper: []string{"127.0.0.1:2181"}, Cluster: "talos_test", Shard: "01", Name: "r1",
		Replicas: []string{"127.0.0.1:9000", "127.0.0.1:9001"}}
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ZooKeeper []string `xml:"zookeeper>node>port"`
		Shard     string   `xml:"macros>shard"`
		Replica   string   `xml:"macros>replica"`
		Hosts     []string `xml:"remote_servers>talos_test>shard>replica>port"`
		DDL       string   `xml:"distributed_ddl>path"`
	}
	c := config{dir: "/data/ch", tcp: 9000, http: 8123, interserver: 9009, replica: r}
	if err := xml.Unmarshal([]byte(serverConfig(c)), &cfg); err != nil {
		t.Fatalf("%v\n%s", err, serverConfig(c))
	}
	if strings.Join(cfg.ZooKeeper, ",") != "2181" || cfg.Shard != "01" || cfg.Replica != "r1" ||
		strings.Join(cfg.Hosts, ",") != "9000,9001" || cfg.DDL == "" {
		t.Fatalf("replica config read as %+v", cfg)
	}
	if plain := serverConfig(config{dir: "/data/ch", tcp: 9000}); strings.Contains(plain, "zookeeper") || strings.Contains(plain, "remote_servers") {
		t.Fatal("a server on its own is configured as a replica")
	}
	for _, bad := range []Replica{
		{Cluster: "talos_test", Shard: "01", Name: "r1", Replicas: r.Replicas},
		{ZooKeeper: r.ZooKeeper, Cluster: "talos-test", Shard: "01", Name: "r1", Replicas: r.Replicas},
		{ZooKeeper: r.ZooKeeper, Cluster: "c", Shard: "01", Name: "r1", Replicas: []string{"nohostport"}},
	} {
		if _, err := Start(context.Background(), Options{Binary: "/nonexistent", Replica: &bad}); err == nil || !strings.Contains(err.Error(), "replica") {
			t.Errorf("%+v: %v, want refused as a replica", bad, err)
		}
	}
}
