package chserver

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// clusterName is what a cluster may be called: it is an XML tag here and
// a name in DDL.
var clusterName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Replica makes a server one replica of a ClickHouse cluster of one
// shard: ZooKeeper coordinates the replicated tables and the cluster's
// DDL (ON CLUSTER), the macros name this replica, and remote_servers
// lists every replica under the cluster's name.
type Replica struct {
	// ZooKeeper is host:port of each ZooKeeper server.
	ZooKeeper []string
	// Cluster is the cluster's name (remote_servers, ON CLUSTER).
	Cluster string
	// Shard and Name are the macros {shard} and {replica}.
	Shard, Name string
	// Replicas is the native host:port of every replica of the shard,
	// this one included.
	Replicas []string
}

// check refuses what would make a broken config.
func (r *Replica) check() error {
	if r.Cluster == "" || r.Shard == "" || r.Name == "" || len(r.ZooKeeper) == 0 || len(r.Replicas) == 0 {
		return fmt.Errorf("chserver: a replica needs ZooKeeper, Cluster, Shard, Name and Replicas")
	}
	if !clusterName.MatchString(r.Cluster) {
		return fmt.Errorf("chserver: a replica's cluster name %q: lowercase letters, digits and _ only", r.Cluster)
	}
	for _, a := range append(append([]string{}, r.ZooKeeper...), r.Replicas...) {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("chserver: replica address %q: %w", a, err)
		}
	}
	return nil
}

// replicaConfig is the config section of r (empty for nil): zookeeper,
// macros, remote_servers and distributed_ddl.
func replicaConfig(r *Replica) string {
	if r == nil {
		return ""
	}
	node := func(tag, addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("      <%s><host>%s</host><port>%s</port></%s>\n", tag, xmlEscape(host), xmlEscape(port), tag)
	}
	var zk, replicas strings.Builder
	for _, a := range r.ZooKeeper {
		zk.WriteString(node("node", a))
	}
	for _, a := range r.Replicas {
		replicas.WriteString(node("replica", a))
	}
	return fmt.Sprintf(`  <zookeeper>
%s    <session_timeout_ms>10000</session_timeout_ms>
  </zookeeper>
  <macros>
    <shard>%s</shard>
    <replica>%s</replica>
  </macros>
  <remote_servers>
    <%s>
      <shard>
      <internal_replication>true</internal_replication>
%s      </shard>
    </%[4]s>
  </remote_servers>
  <distributed_ddl>
    <path>/clickhouse/task_queue/ddl</path>
  </distributed_ddl>
`, strings.ReplaceAll(zk.String(), "      <node>", "    <node>"), xmlEscape(r.Shard), xmlEscape(r.Name), r.Cluster, replicas.String())
}
