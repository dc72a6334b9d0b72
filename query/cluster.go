package query

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Cluster is where migrations build a Talos database: one server (the
// zero value) or every replica of a ClickHouse cluster (DESIGN.md §4,
// cluster mode). The supported shape is one shard of N replicas: each
// replica holds every row, so the views read the same on any of them.
type Cluster struct {
	// Name is the cluster, as the servers' remote_servers name it; the
	// DDL runs ON CLUSTER Name. Empty: one server, DDL as it always was.
	Name string
	// InsertQuorum, when 2 or more, makes each of the sink's inserts
	// succeed only once that many replicas hold it (insert_quorum); 0:
	// an insert one replica accepted succeeds, and the others fetch it.
	InsertQuorum int
	// QuorumTimeout bounds how long an insert waits for its quorum
	// (default DefaultQuorumTimeout; ClickHouse's own is 10 minutes): then
	// it fails, and the sink retries it (a block already stored is not
	// stored twice: replicated tables deduplicate a block inserted again).
	QuorumTimeout time.Duration
}

// DefaultQuorumTimeout is Cluster.QuorumTimeout's default.
const DefaultQuorumTimeout = 30 * time.Second

// Check refuses a cluster name that cannot be spliced into DDL and a
// quorum without a cluster or below 0.
func (c Cluster) Check() error {
	switch {
	case c.Name != "" && !ValidName(c.Name):
		return fmt.Errorf("query: --clickhouse-cluster %q: a cluster name is lowercase letters, digits and _", c.Name)
	case c.InsertQuorum < 0:
		return fmt.Errorf("query: --clickhouse-insert-quorum %d: not a number of replicas", c.InsertQuorum)
	case c.InsertQuorum > 0 && c.Name == "":
		return fmt.Errorf("query: --clickhouse-insert-quorum needs --clickhouse-cluster: one server has no replicas to wait for")
	}
	return nil
}

// ddlContext is ctx for the migrations' statements on c: on a cluster, an
// ALTER of a replicated table returns only once every replica applied it
// (replication_alter_partitions_sync = 2, which 18.16 knows by this name
// and newer servers as alter_sync), so a view created next on every
// replica finds the new column there.
func (c Cluster) ddlContext(ctx context.Context) context.Context {
	if !c.On() {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"replication_alter_partitions_sync": 2}))
}

// writerSettings are the sink's query settings on c.
func (c Cluster) writerSettings() clickhouse.Settings {
	if c.InsertQuorum < 2 {
		return nil
	}
	timeout := c.QuorumTimeout
	if timeout <= 0 {
		timeout = DefaultQuorumTimeout
	}
	return clickhouse.Settings{"insert_quorum": c.InsertQuorum, "insert_quorum_timeout": int(timeout.Milliseconds())}
}

// On reports whether migrations run on a cluster.
func (c Cluster) On() bool { return c.Name != "" }

// ReplicaPath is the ZooKeeper path of a replicated table: the server's
// {shard} macro, the database and the table, so two databases on one
// cluster never share a table's replicas. {replica} names the replica.
const ReplicaPath = "/clickhouse/tables/{shard}/%s/%s"

var (
	// Each statement of a migration begins with one of these verbs.
	createRe = regexp.MustCompile("^\\s*CREATE\\s+(TABLE|VIEW|DATABASE)\\s+(IF\\s+NOT\\s+EXISTS\\s+)?([\\w`.]+)")
	dropRe   = regexp.MustCompile("^\\s*DROP\\s+(TABLE|VIEW|DATABASE)\\s+(IF\\s+EXISTS\\s+)?([\\w`.]+)\\s*$")
	// Statements on an existing table: a replicated table replicates them
	// itself, so they run once, on the server migrating.
	replicatedRe = regexp.MustCompile(`^\s*(ALTER\s+TABLE|INSERT\s+INTO|OPTIMIZE\s+TABLE)\s`)
	engineRe     = regexp.MustCompile(`ENGINE\s*=\s*(\w+)(?:\s*\(([^)]*)\))?`)
)

// statement is stmt (its {db} already replaced) as it runs on c. On one
// server it is stmt. On a cluster, CREATE and DROP of tables, views and
// the database run ON CLUSTER, and every MergeTree table is created as
// its Replicated* engine under ReplicaPath; ALTER, INSERT and OPTIMIZE
// of a table run as they are (the table replicates them). Anything else
// is an error, so a migration this does not know fails before it runs
// on half a cluster.
func (c Cluster) statement(stmt, database string) (string, error) {
	if !c.On() {
		return stmt, nil
	}
	if !ValidName(c.Name) {
		return "", fmt.Errorf("query: invalid cluster name %q", c.Name)
	}
	onCluster := " ON CLUSTER `" + c.Name + "`"
	if m := dropRe.FindStringSubmatchIndex(stmt); m != nil {
		return stmt[:m[7]] + onCluster, nil
	}
	if replicatedRe.MatchString(stmt) {
		return stmt, nil
	}
	m := createRe.FindStringSubmatchIndex(stmt)
	if m == nil {
		return "", fmt.Errorf("query: cluster mode does not know how to run %q on every replica", firstLine(stmt))
	}
	out := stmt[:m[1]] + onCluster + stmt[m[1]:]
	if kind := stmt[m[2]:m[3]]; kind != "TABLE" {
		return out, nil
	}
	name := stmt[m[6]:m[7]]
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	return replicated(out, database, strings.Trim(name, "`"))
}

// replicated gives CREATE TABLE stmt of table the Replicated* form of its
// MergeTree engine, the engine's own arguments after the two of
// replication.
func replicated(stmt, database, table string) (string, error) {
	m := engineRe.FindStringSubmatchIndex(stmt)
	if m == nil {
		return "", fmt.Errorf("query: cluster mode: table %s names no engine", table)
	}
	engine, args := stmt[m[2]:m[3]], ""
	if m[4] >= 0 {
		args = strings.TrimSpace(stmt[m[4]:m[5]])
	}
	if !strings.HasSuffix(engine, "MergeTree") || strings.HasPrefix(engine, "Replicated") {
		return "", fmt.Errorf("query: cluster mode: table %s has engine %s, which has no replicated form", table, engine)
	}
	repl := fmt.Sprintf("ENGINE = Replicated%s('"+ReplicaPath+"', '{replica}'", engine, database, table)
	if args != "" {
		repl += ", " + args
	}
	return stmt[:m[0]] + repl + ")" + stmt[m[1]:], nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// MigrateCluster is Migrate on c: on a cluster every replica gets the
// same schema, replicated tables (schema_migrations too) and the same
// views. A cluster's DDL waits for every replica (the servers'
// distributed_ddl_task_timeout), so a migration needs them all up; a
// database already at SchemaVersion is left alone without DDL, so a
// sink starting while a replica is down is not held up.
func MigrateCluster(ctx context.Context, conn driver.Conn, database string, c Cluster) error {
	return migrateOn(ctx, conn, database, migrations, c)
}

// current reports whether database on conn's server already records
// every migration of list.
func current(ctx context.Context, conn driver.Conn, database string, list []migration) (bool, error) {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?",
		database, TableSchemaMigrations).Scan(&n); err != nil {
		return false, fmt.Errorf("query: read tables: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	applied, err := appliedVersions(ctx, conn, "`"+database+"`")
	if err != nil {
		return false, err
	}
	for _, m := range list {
		if !applied[m.version] {
			return false, nil
		}
	}
	return true, nil
}
