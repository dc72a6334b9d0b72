package query

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }

// migrated returns a connection to a fresh, migrated database.
func migrated(t testing.TB) (context.Context, driver.Conn, string) {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn, err := Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	return ctx, conn, db
}

// migratedTo returns a connection, with no default database, to a fresh
// database migrated to version (the first version migrations), the state
// a migration test starts from.
func migratedTo(t *testing.T, version uint32) (context.Context, driver.Conn, string) {
	t.Helper()
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn, err := Open(ctx, addr, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := migrate(ctx, conn, db, migrations[:version]); err != nil {
		t.Fatal(err)
	}
	if v, err := AppliedVersion(ctx, conn, db); err != nil || v != version {
		t.Fatalf("AppliedVersion = %d, %v; want %d", v, err, version)
	}
	return ctx, conn, db
}

func count(t testing.TB, ctx context.Context, conn driver.Conn, sql string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
