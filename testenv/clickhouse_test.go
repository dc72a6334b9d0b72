package testenv

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestStartFailure(t *testing.T) {
	other := errors.New("port in use")
	for _, tc := range []struct {
		name      string
		err       error
		ci        bool
		wantSkip  bool
		wantFatal bool
	}{
		{"missing, local", ErrClickHouseNotFound, false, true, false},
		{"missing, CI", ErrClickHouseNotFound, true, false, true},
		{"other error", other, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skip, fatal := startFailure(tc.err, tc.ci)
			if (skip != "") != tc.wantSkip || fatal != tc.wantFatal {
				t.Fatalf("startFailure = %q, %v", skip, fatal)
			}
			if tc.wantSkip && !strings.Contains(skip, "apt-get install") {
				t.Fatalf("skip message %q lacks the install hint", skip)
			}
		})
	}
}

func TestClickHouseStartStop(t *testing.T) {
	if _, err := FindClickHouse(); err != nil {
		t.Fatal(err) // scripts/test.sh installs it
	}
	ctx := context.Background()
	start := time.Now()
	ch, err := StartClickHouse(ctx, ClickHouseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clickhouse-server ready in %s at %s", time.Since(start).Round(time.Millisecond), ch.Addr())
	stopped := false
	defer func() {
		if !stopped {
			ch.Stop()
		}
	}()
	if !strings.HasPrefix(ch.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr = %q, want loopback", ch.Addr())
	}
	conn, err := ch.Open("")
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("server version %s", v)
	conn.Close()

	// NewDatabase against this server: created, then dropped by cleanup.
	setShared(ch.Addr(), "")
	defer setShared("", "")
	var db string
	t.Run("NewDatabase", func(t *testing.T) {
		_, db = NewDatabase(t)
		if n := countDatabases(t, ch, db); n != 1 {
			t.Fatalf("database %s: %d found, want 1", db, n)
		}
	})
	if n := countDatabases(t, ch, db); n != 0 {
		t.Fatalf("database %s still exists after the test", db)
	}

	dir := ch.Dir()
	start = time.Now()
	if err := ch.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	select {
	case <-ch.Exited():
	default:
		t.Fatal("process still running after Stop")
	}
	if c, err := net.DialTimeout("tcp", ch.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("port still open after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s not removed: %v", dir, err)
	}
	if err := ch.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func countDatabases(t *testing.T, ch *ClickHouse, db string) uint64 {
	t.Helper()
	conn, err := ch.Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM system.databases WHERE name = '"+db+"'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
