package main

import (
	"encoding/xml"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/talos-audit/talos/query"
)

// chClusterConfig is what deploy/clickhouse/cluster.xml and the replicas'
// macros files say.
type chClusterConfig struct {
	ZooKeeper []struct {
		Host string `xml:"host"`
		Port string `xml:"port"`
	} `xml:"zookeeper>node"`
	RemoteServers struct {
		Clusters []struct {
			XMLName xml.Name
			Shards  []struct {
				Internal string `xml:"internal_replication"`
				Replicas []struct {
					Host   string `xml:"host"`
					Port   string `xml:"port"`
					Secure string `xml:"secure"`
				} `xml:"replica"`
			} `xml:"shard"`
		} `xml:",any"`
	} `xml:"remote_servers"`
	DDLPath    string `xml:"distributed_ddl>path"`
	Replicated string `xml:"user_directories>replicated>zookeeper_path"`
	Macros     struct {
		Shard   string `xml:"shard"`
		Replica string `xml:"replica"`
	} `xml:"macros"`
}

func readCHConfig(t *testing.T, file string) chClusterConfig {
	t.Helper()
	raw, err := os.ReadFile("../../" + file)
	if err != nil {
		t.Fatal(err)
	}
	var c chClusterConfig
	if err := xml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c
}

// TestComposeClickHouseCluster keeps docker-compose's replicated
// ClickHouse consistent without a Docker engine: the cluster the sinks
// migrate ON CLUSTER (TALOS_CLICKHOUSE_CLUSTER) is the one cluster of
// deploy/clickhouse/cluster.xml, whose one shard lists every replica
// service on the secure port, in the order of TALOS_CLICKHOUSE_ADDR; its
// ZooKeeper is the zookeeper service; each replica mounts cluster.xml and
// its own macros, which define every macro the replicated tables' DDL
// names, one shard and distinct replica names; SQL users live in
// ZooKeeper, so the users the sinks create reach both replicas.
func TestComposeClickHouseCluster(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Image       string                       `yaml:"image"`
			Hostname    string                       `yaml:"hostname"`
			DependsOn   map[string]map[string]string `yaml:"depends_on"`
			Volumes     []string                     `yaml:"volumes"`
			Environment map[string]string            `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	svc := doc.Services
	cfg := readCHConfig(t, "deploy/clickhouse/cluster.xml")
	cluster := svc["worker1"].Environment["TALOS_CLICKHOUSE_CLUSTER"]
	if cluster == "" || (query.Cluster{Name: cluster}).Check() != nil {
		t.Fatalf("the sinks' cluster %q is no cluster name", cluster)
	}
	if cs := cfg.RemoteServers.Clusters; len(cs) != 1 || cs[0].XMLName.Local != cluster || len(cs[0].Shards) != 1 || cs[0].Shards[0].Internal != "true" {
		t.Fatalf("deploy/clickhouse/cluster.xml: want one cluster %s of one shard with internal replication, got %+v", cluster, cs)
	}
	var listed []string
	for _, r := range cfg.RemoteServers.Clusters[0].Shards[0].Replicas {
		if r.Secure != "1" {
			t.Errorf("replica %s:%s is not reached over TLS (ClickHouse serves no other port)", r.Host, r.Port)
		}
		listed = append(listed, r.Host+":"+r.Port)
	}
	for _, name := range []string{"worker1", "worker2", "web", "talosctl"} {
		if addr := svc[name].Environment["TALOS_CLICKHOUSE_ADDR"]; addr != strings.Join(listed, ",") {
			t.Errorf("%s reaches ClickHouse at %s; the cluster's replicas are %v", name, addr, listed)
		}
	}
	if svc["worker2"].Environment["TALOS_CLICKHOUSE_CLUSTER"] != cluster || svc["web"].Environment["TALOS_CLICKHOUSE_CLUSTER"] != "" {
		t.Error("every sink, and only the sinks, migrate ON CLUSTER")
	}
	if len(cfg.ZooKeeper) != 1 || cfg.ZooKeeper[0].Port != "2181" || !strings.HasPrefix(svc[cfg.ZooKeeper[0].Host].Image, "zookeeper:") {
		t.Fatalf("deploy/clickhouse/cluster.xml's ZooKeeper %+v is not the zookeeper service on 2181", cfg.ZooKeeper)
	}
	if cfg.DDLPath == "" || cfg.Replicated == "" {
		t.Errorf("deploy/clickhouse/cluster.xml: distributed DDL at %q, users in ZooKeeper at %q; want both", cfg.DDLPath, cfg.Replicated)
	}
	// The macros the replicated tables' DDL names: {shard} in the path and
	// {replica} for the replica.
	macros := regexp.MustCompile(`\{(\w+)\}`).FindAllStringSubmatch(query.ReplicaPath+" {replica}", -1)
	shards, names := map[string]bool{}, map[string]bool{}
	for i, name := range chReplicas {
		s := svc[name]
		if listed[i] != name+":9440" || s.Hostname != name || s.DependsOn[cfg.ZooKeeper[0].Host]["condition"] != "service_healthy" {
			t.Errorf("%s: host name %q, listed as %s, waits for ZooKeeper: %v", name, s.Hostname, listed[i], s.DependsOn)
		}
		if !slices.Contains(s.Volumes, "./deploy/clickhouse/cluster.xml:/etc/clickhouse-server/config.d/cluster.xml:ro") {
			t.Errorf("%s does not mount deploy/clickhouse/cluster.xml", name)
		}
		file := ""
		for _, v := range s.Volumes {
			if m := regexp.MustCompile(`^\./(deploy/clickhouse/replica\d\.xml):/etc/clickhouse-server/config\.d/replica\.xml:ro$`).FindStringSubmatch(v); m != nil {
				file = m[1]
			}
		}
		if file == "" {
			t.Fatalf("%s mounts no macros file", name)
		}
		m := readCHConfig(t, file).Macros
		for _, macro := range macros {
			if v := map[string]string{"shard": m.Shard, "replica": m.Replica}[macro[1]]; v == "" {
				t.Errorf("%s (%s) does not define the macro {%s} the DDL uses", name, file, macro[1])
			}
		}
		shards[m.Shard], names[m.Replica] = true, true
		if svc["worker1"].DependsOn[name]["condition"] != "service_healthy" {
			t.Errorf("the workers do not wait for %s", name)
		}
	}
	if len(shards) != 1 || len(names) != len(chReplicas) {
		t.Errorf("the replicas' macros give shards %v and replicas %v; want one shard and a name each", shards, names)
	}
}
