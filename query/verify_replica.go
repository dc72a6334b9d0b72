package query

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts/verify"
)

// ReplicaBacklog is what a ClickHouse replica still had to fetch for a
// database's replicated tables (system.replicas) while it was read: parts
// inserted through another replica that this one did not hold yet. A
// verification through such a replica may report a chain or checkpoint gap
// that the other replicas do not have.
type ReplicaBacklog struct {
	// Inserts is how many inserted parts waited in the replication queues.
	Inserts uint64 `json:"inserts"`
	// DelaySeconds is how far behind the replica was (the largest
	// absolute_delay).
	DelaySeconds uint64 `json:"delay_seconds"`
	// Tables are the tables that waited for parts.
	Tables []string `json:"tables"`
}

// ReadReplicaBacklog reads what the replica conn reaches still has to
// fetch for database's tables: nil when nothing, and for a database that
// is not replicated.
func ReadReplicaBacklog(ctx context.Context, conn driver.Conn, database string) (*ReplicaBacklog, error) {
	rows, err := conn.Query(ctx, "SELECT table, inserts_in_queue, absolute_delay FROM system.replicas "+
		"WHERE database = ? AND (inserts_in_queue > 0 OR absolute_delay > 0) ORDER BY table", database)
	if err != nil {
		return nil, fmt.Errorf("replication queue: %w", err)
	}
	defer rows.Close()
	var b ReplicaBacklog
	for rows.Next() {
		var (
			table   string
			inserts uint32
			delay   uint64
		)
		if err := rows.Scan(&table, &inserts, &delay); err != nil {
			return nil, fmt.Errorf("replication queue: %w", err)
		}
		b.Tables = append(b.Tables, table)
		b.Inserts += uint64(inserts)
		b.DelaySeconds = max(b.DelaySeconds, delay)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replication queue: %w", err)
	}
	if len(b.Tables) == 0 {
		return nil, nil
	}
	return &b, nil
}

// add is what b and o waited for together (either may be nil).
func (b *ReplicaBacklog) add(o *ReplicaBacklog) *ReplicaBacklog {
	switch {
	case b == nil:
		return o
	case o == nil:
		return b
	}
	tables := slices.Concat(b.Tables, o.Tables)
	slices.Sort(tables)
	return &ReplicaBacklog{Inserts: max(b.Inserts, o.Inserts), DelaySeconds: max(b.DelaySeconds, o.DelaySeconds),
		Tables: slices.Compact(tables)}
}

// warning is the line talosctl verify prints before its findings.
func (b *ReplicaBacklog) warning() string {
	return fmt.Sprintf("WARNING    the replica read had %d inserted parts still to fetch (%s; up to %d s behind): "+
		"records it did not hold yet were not verified, and a gap reported here may be one of them. "+
		"Verify again once its replication queue is empty "+
		"(SELECT table, queue_size, absolute_delay FROM system.replicas), or through another replica",
		b.Inserts, strings.Join(b.Tables, ", "), b.DelaySeconds)
}

// VerifyDatabaseOutcome is VerifyDatabaseWith as talosctl verify reports
// it, source naming the database. It reads the replica's backlog before
// and after (ReadReplicaBacklog): a replica still catching up is named in
// the outcome, so that a gap it shows comes with the likely reason. The
// backlog is advisory; a replica that cannot tell it is verified all the
// same.
func VerifyDatabaseOutcome(ctx context.Context, conn driver.Conn, source, database string, keys verify.KeySet,
	opts VerifyOptions) (*VerifyOutcome, error) {
	before, _ := ReadReplicaBacklog(ctx, conn, database)
	rep, err := VerifyDatabaseWith(ctx, conn, database, keys, opts)
	if err != nil {
		return nil, err
	}
	out := NewVerifyOutcome(source, rep)
	after, _ := ReadReplicaBacklog(ctx, conn, database)
	out.Replica = before.add(after)
	return out, nil
}
