package query

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestClusterStatements: in cluster mode every statement of every
// migration (present and future: the list is walked, not copied) runs ON
// CLUSTER or on a replicated table, every table is created with the
// Replicated form of its engine under its own ZooKeeper path, and on one
// server the statements are untouched; statements cluster mode cannot
// place are refused with the reason.
func TestClusterStatements(t *testing.T) {
	c := Cluster{Name: "talos"}
	onCluster := regexp.MustCompile("^\\s*(CREATE (TABLE|VIEW) IF NOT EXISTS `db`\\.\\w+|DROP TABLE IF EXISTS `db`\\.\\w+) ON CLUSTER `talos`")
	tables := 0
	for _, m := range migrations {
		for i, stmt := range m.statements {
			stmt = strings.ReplaceAll(stmt, "{db}", "`db`")
			if s, err := (Cluster{}).statement(stmt, "db"); err != nil || s != stmt {
				t.Fatalf("migration %d statement %d changed on one server: %v\n%s", m.version, i+1, err, s)
			}
			s, err := c.statement(stmt, "db")
			if err != nil {
				t.Fatalf("migration %d statement %d: %v", m.version, i+1, err)
			}
			if !onCluster.MatchString(s) && !replicatedRe.MatchString(s) {
				t.Errorf("migration %d statement %d runs on one replica only:\n%s", m.version, i+1, s)
			}
			if strings.Contains(s, "ENGINE") {
				tables++
				name := createRe.FindStringSubmatch(stmt)[3]
				want := fmt.Sprintf("ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/%s', '{replica}')", strings.TrimPrefix(name, "`db`."))
				if !strings.Contains(s, want) {
					t.Errorf("migration %d statement %d: no %s in\n%s", m.version, i+1, want, s)
				}
			}
		}
	}
	if tables < 8 {
		t.Fatalf("%d tables created by the migrations, want the 8 of DESIGN.md at least", tables)
	}
	for stmt, want := range map[string]string{
		"CREATE TABLE IF NOT EXISTS `db`.t (v UInt64) ENGINE = ReplacingMergeTree(v) ORDER BY v": "CREATE TABLE IF NOT EXISTS `db`.t ON CLUSTER `talos` (v UInt64) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}', v) ORDER BY v",
		"CREATE DATABASE IF NOT EXISTS `db`":                                                     "CREATE DATABASE IF NOT EXISTS `db` ON CLUSTER `talos`",
		"DROP TABLE IF EXISTS `db`.v_x\n":                                                        "DROP TABLE IF EXISTS `db`.v_x ON CLUSTER `talos`",
		"ALTER TABLE `db`.receipts ADD COLUMN x String":                                          "ALTER TABLE `db`.receipts ADD COLUMN x String",
		"CREATE TABLE `db`.m (v UInt8) ENGINE = Memory":                                          "error: query: cluster mode: table m has engine Memory, which has no replicated form",
		"CREATE TABLE `db`.r (v UInt8) ENGINE = ReplicatedMergeTree()":                           "error: query: cluster mode: table r has engine ReplicatedMergeTree, which has no replicated form",
		"CREATE MATERIALIZED VIEW `db`.mv AS SELECT 1":                                           "error: query: cluster mode does not know how to run",
		"RENAME TABLE `db`.a TO `db`.b":                                                          "error: query: cluster mode does not know how to run",
	} {
		s, err := c.statement(stmt, "db")
		got := s
		if err != nil {
			got = "error: " + err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("%s\n  became %s\n  want %s", stmt, s+fmt.Sprint(err), want)
		}
	}
	if _, err := (Cluster{Name: "talos; DROP"}).statement("CREATE DATABASE `db`", "db"); err == nil {
		t.Error("a cluster name that is no name was spliced into DDL")
	}
	for _, bad := range []Cluster{{Name: "A-b"}, {InsertQuorum: 2}, {Name: "c", InsertQuorum: -1}} {
		if bad.Check() == nil {
			t.Errorf("%+v passed Check", bad)
		}
	}
}

// clusterForTest starts ZooKeeper and two clickhouse-servers (not with
// -short) and gives the test three minutes from then.
func clusterForTest(t *testing.T) (*testenv.ClickHouseCluster, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts ZooKeeper and two clickhouse-servers")
	}
	ch := testenv.ClickHouseClusterForTest(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ch, ctx
}

// TestMigrateOnCluster: on two replicas of a real cluster (ZooKeeper and
// two clickhouse-servers), the sink's start migrates ON CLUSTER through
// either address: both replicas get the same replicated tables, views and
// schema_migrations; rows the sink writes through one are read the same
// through the other; migrating again needs no DDL (it works with a
// replica down); and with --clickhouse-insert-quorum 2 an insert fails
// while a replica is down instead of being held by one replica only.
func TestMigrateOnCluster(t *testing.T) {
	ch, ctx := clusterForTest(t)
	const db = "talos_cluster"
	at := func(user string) Endpoint { return Endpoint{Addr: ch.Addrs(), User: user} }
	l := Logins{Admin: at(AdminUser), Writer: at(WriterUser), Reader: at(ReaderUser)}
	cl := Cluster{Name: ch.Name()}
	writer, err := OpenMigrated(ctx, l, db, cl)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	r0, r1 := ch.Open(t, 0), ch.Open(t, 1)
	schema := func(i int) string {
		var s string
		q := "SELECT arrayStringConcat(groupArray(concat(name, ' ', engine)), ', ') FROM (SELECT name, engine FROM system.tables WHERE database = ? ORDER BY name)"
		if err := ch.Open(t, i).QueryRow(ctx, q, db).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s0, s1 := schema(0), schema(1)
	if s0 != s1 || !strings.Contains(s0, "receipts ReplicatedReplacingMergeTree") || !strings.Contains(s0, "v_decisions View") ||
		!strings.Contains(s0, "schema_migrations ReplicatedReplacingMergeTree") || strings.Contains(s0, " ReplacingMergeTree") {
		t.Fatalf("schemas differ or are not replicated:\nreplica 0: %s\nreplica 1: %s", s0, s1)
	}
	if err := NewSinkWriter(writer, db).Write(ctx, sinkBatch(t, 5)); err != nil {
		t.Fatal(err)
	}
	views := "SELECT (SELECT count() FROM `" + db + "`.v_receipts), (SELECT count() FROM `" + db + "`.v_tool_calls)"
	testenv.WaitFor(t, 30*time.Second, func() bool {
		var a, b uint64
		err := r1.QueryRow(ctx, views).Scan(&a, &b)
		return err == nil && a == 10 && b == 5
	})
	if v, err := AppliedVersion(ctx, r1, db); err != nil || v != SchemaVersion() {
		t.Fatalf("replica 1: schema version %d (%v), want %d", v, err, SchemaVersion())
	}
	var a, b uint64
	if err := r0.QueryRow(ctx, views).Scan(&a, &b); err != nil || a != 10 || b != 5 {
		t.Fatalf("replica 0: %d receipts and %d tool calls in the views (%v), want 10 and 5", a, b, err)
	}

	// A later migration's new column, and a view reading it, reach both
	// replicas (the view is created on each, possibly before the other
	// has applied the column: the ALTER must be there first).
	later := migration{version: SchemaVersion() + 1, name: "cluster probe",
		addColumns: []column{{TableReceipts, "cluster_probe", "String"}},
		statements: []string{"CREATE VIEW IF NOT EXISTS {db}.v_cluster_probe AS SELECT receipt_id, cluster_probe FROM {db}.receipts"}}
	if err := migrateOn(ctx, r0, db, append(slices.Clone(migrations), later), cl); err != nil {
		t.Fatalf("a later migration on the cluster: %v", err)
	}
	probe := "SELECT count() FROM `" + db + "`.v_cluster_probe WHERE cluster_probe = ''"
	for i, conn := range []driver.Conn{r0, r1} {
		if n := count(t, ctx, conn, probe); n != 10 {
			t.Fatalf("replica %d: %d rows in the later migration's view, want 10", i, n)
		}
	}

	ch.Stop(1)
	if err := MigrateCluster(ctx, r0, db, cl); err != nil {
		t.Fatalf("migrating a current database with a replica down: %v", err)
	}
	quorum, err := OpenMigrated(ctx, Logins{Admin: Endpoint{Addr: ch.Addr(0)}, Writer: Endpoint{Addr: ch.Addr(0), User: WriterUser}},
		db, Cluster{Name: ch.Name(), InsertQuorum: 2, QuorumTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer quorum.Close()
	began := time.Now()
	err = NewSinkWriter(quorum, db).Write(ctx, sinkBatch(t, 1))
	if err == nil || !regexp.MustCompile(`alive replicas|for quorum`).MatchString(err.Error()) {
		t.Fatalf("an insert with quorum 2 and one replica down: %v, want refused for the quorum", err)
	}
	t.Logf("with a replica down, quorum 2: refused after %v: %v", time.Since(began).Round(time.Millisecond), err)
	if err := NewSinkWriter(writer, db).Write(ctx, sinkBatch(t, 1)); err != nil {
		t.Fatalf("without a quorum, with a replica down: %v", err)
	}
}

// TestVerifyNamesAReplicaBehind: verifying through a replica that has not
// fetched what was inserted through another names its backlog (text and
// JSON), so that a gap it shows comes with why; through the replica that
// took the inserts, and through the first one once it has caught up, the
// outcome names none. The reader, talosctl verify's user, can tell.
func TestVerifyNamesAReplicaBehind(t *testing.T) {
	ch, ctx := clusterForTest(t)
	const db = "talos_lag"
	l := Logins{Admin: Endpoint{Addr: ch.Addr(0), User: AdminUser}, Writer: Endpoint{Addr: ch.Addr(0), User: WriterUser}}
	writer, err := OpenMigrated(ctx, l, db, Cluster{Name: ch.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	reader := func(i int) driver.Conn {
		conn, err := Endpoint{Addr: ch.Addr(i), User: ReaderUser}.Open(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	r0, r1 := reader(0), reader(1)
	m := newSinkMaker(t)
	keys := verify.KeySet{m.key.KID: m.key.Public()}
	var recs []schemas.AuditRecord
	for i := range 4 {
		fx := m.next(t, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	outcome := func(conn driver.Conn) *VerifyOutcome {
		t.Helper()
		out, err := VerifyDatabaseOutcome(ctx, conn, "replica", db, keys, VerifyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	if err := ch.Open(t, 1).Exec(ctx, "SYSTEM STOP FETCHES"); err != nil {
		t.Fatal(err)
	}
	if err := NewSinkWriter(writer, db).Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() bool {
		b, err := ReadReplicaBacklog(ctx, r1, db)
		return err == nil && b != nil
	})
	behind := outcome(r1)
	if b := behind.Replica; b == nil || b.Inserts == 0 || !slices.Contains(b.Tables, TableReceipts) {
		t.Fatalf("through the replica without the rows: backlog %+v, want the receipts table's inserts", b)
	}
	var text, js strings.Builder
	if err := behind.WriteText(&text); err != nil || !strings.HasPrefix(text.String(), "WARNING ") ||
		!strings.Contains(text.String(), "through another replica") {
		t.Fatalf("text: %q (%v), want the warning first", text.String(), err)
	}
	if err := behind.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"replica_backlog":{"inserts":`) {
		t.Fatalf("JSON: %s (%v), want replica_backlog", js.String(), err)
	}
	ahead := outcome(r0)
	if ahead.Replica != nil || ahead.Report.Checked != 8 || behind.Report.Checked == 8 || len(ahead.Report.Problems) != 0 {
		t.Fatalf("through the replica that took the inserts: backlog %+v, %d receipts checked (%d through the other), problems %v; want none, 8 (fewer), none",
			ahead.Replica, ahead.Report.Checked, behind.Report.Checked, ahead.Report.Problems)
	}

	if err := ch.Open(t, 1).Exec(ctx, "SYSTEM START FETCHES"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() bool {
		b, err := ReadReplicaBacklog(ctx, r1, db)
		return err == nil && b == nil
	})
	// Caught up, it reads as the other does: clean.
	if caught := outcome(r1); caught.Replica != nil || caught.Report.Checked != 8 || len(caught.Report.Problems) != 0 {
		t.Fatalf("through the replica caught up: backlog %+v, %d receipts checked, problems %v; want none, 8, none",
			caught.Replica, caught.Report.Checked, caught.Report.Problems)
	}
}
