package query

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Connection pool bounds used by Open.
const (
	MaxOpenConns    = 8
	MaxIdleConns    = 4
	DialTimeout     = 10 * time.Second
	ConnMaxLifetime = 30 * time.Minute
)

// Open connects to the ClickHouse native protocol at addr (host:port) as
// AdminUser over plain TCP, and pings it (Endpoint.Open). Tests and
// tools on a private server use it; talosd and talosctl log in with the
// Endpoint of their flags.
func Open(ctx context.Context, addr, database string) (driver.Conn, error) {
	return Endpoint{Addr: addr}.Open(ctx, database)
}

var namePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ValidName reports whether s is an acceptable database or table name. Names
// are spliced into SQL (DDL cannot take parameters), so only these pass.
func ValidName(s string) bool { return len(s) <= 64 && namePattern.MatchString(s) }

// table returns `database`.`name` after validating both.
func table(database, name string) (string, error) {
	if !ValidName(database) {
		return "", fmt.Errorf("query: invalid database name %q", database)
	}
	if !ValidName(name) {
		return "", fmt.Errorf("query: invalid table name %q", name)
	}
	return "`" + database + "`.`" + name + "`", nil
}

// streamBlockRows is the block size of streamed SELECTs: the client holds
// one block at a time, so this bounds a stream's memory (2,048 receipts of
// about 2 KB: a few MiB) instead of the server's default 65,536 rows.
const streamBlockRows = 2048

// streamSortBytes bounds the memory ClickHouse spends sorting a streamed
// SELECT (a whole table in chain order); beyond it the server sorts on
// disk instead of failing with "memory limit exceeded".
const streamSortBytes = 256 << 20

// streamContext asks ClickHouse for small blocks on a streamed SELECT, and
// to sort on disk beyond streamSortBytes.
func streamContext(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_block_size":                 streamBlockRows,
		"max_bytes_before_external_sort": streamSortBytes,
	}))
}

// Logins are talosd's three ClickHouse logins (ServiceFlags).
type Logins struct {
	Admin, Writer, Reader Endpoint
}

// OpenMigrated connects as the admin with no database in the handshake
// (the Talos database may not exist yet: every query names it), migrates
// database on c (MigrateCluster) and, on a server with SQL user
// management, creates the writer and reader and grants them their rights
// (ProvisionUsers); then it closes that connection and returns one as the
// writer (with c's insert quorum). It is what the sink opens first; the
// caller retries it while ClickHouse is not up.
func OpenMigrated(ctx context.Context, l Logins, database string, c Cluster) (driver.Conn, error) {
	admin, err := l.Admin.Open(ctx, "")
	if err != nil {
		return nil, err
	}
	if err := MigrateCluster(ctx, admin, database, c); err != nil {
		_ = admin.Close()
		return nil, err
	}
	if err := ProvisionUsers(ctx, admin, database, l); err != nil {
		_ = admin.Close()
		return nil, err
	}
	if l.Writer == l.Admin && c.InsertQuorum == 0 {
		return admin, nil
	}
	_ = admin.Close()
	return l.Writer.open(ctx, "", c.writerSettings())
}

// selectAll runs q with args and reads every row with scan, in order;
// errors say what was being read.
func selectAll[T any](ctx context.Context, conn driver.Conn, what, q string, scan func(driver.Rows, *T) error, args ...any) ([]T, error) {
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("query: %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var r T
		if err := scan(rows, &r); err != nil {
			return nil, fmt.Errorf("query: %s: %w", what, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: %s: %w", what, err)
	}
	return out, nil
}

// limited appends a LIMIT of n to q when n > 0.
func limited(q string, n int) string {
	if n > 0 {
		return q + fmt.Sprintf(" LIMIT %d", n)
	}
	return q
}
