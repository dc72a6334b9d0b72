package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// EnvClickHouseAddr names an existing ClickHouse (host:port, native protocol)
// that RunWithClickHouse uses instead of starting a private server. Tests
// log in to it as the admin `default` and, like talosd and talosctl by
// default, as talos_writer and talos_reader without a password, which it
// must define as the private server does (DESIGN.md, ClickHouse users).
const EnvClickHouseAddr = "TALOS_TEST_CLICKHOUSE_ADDR"

// shared is the one ClickHouse of a test binary, set by RunWithClickHouse and
// read by NewDatabase. It is the only package-level state: a test binary has
// exactly one TestMain.
var shared struct {
	mu   sync.Mutex
	addr string // empty: no server
	skip string // why NewDatabase skips (no binary, not in CI)
	set  bool   // RunWithClickHouse ran
}

func setShared(addr, skip string) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.addr, shared.skip, shared.set = addr, skip, true
}

// RunWithClickHouse is for TestMain: it starts one private clickhouse-server
// for the test binary (or uses $TALOS_TEST_CLICKHOUSE_ADDR), runs the tests
// and stops the server. When no clickhouse-server is installed, tests that
// call NewDatabase skip with the install hint — unless $CI is set, in which
// case the binary fails loudly.
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }
func RunWithClickHouse(m *testing.M) int {
	defer removeBinaries()
	if addr := os.Getenv(EnvClickHouseAddr); addr != "" {
		setShared(addr, "")
		return m.Run()
	}
	ch, err := StartClickHouse(context.Background(), ClickHouseOptions{})
	if err != nil {
		skip, fatal := startFailure(err, os.Getenv("CI") != "")
		if fatal {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			return 1
		}
		setShared("", skip)
		return m.Run()
	}
	setShared(ch.Addr(), "")
	code := m.Run()
	if err := ch.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// startFailure decides what a failed start means for the test binary: a
// missing binary skips the ClickHouse tests with the install hint, except in
// CI; any other failure fails the binary.
func startFailure(err error, ci bool) (skip string, fatal bool) {
	if errors.Is(err, ErrClickHouseNotFound) && !ci {
		return err.Error(), false
	}
	return "", true
}

// NewDatabase creates a database with a unique name on the test binary's
// ClickHouse and drops it when the test ends. It needs RunWithClickHouse in
// TestMain.
func NewDatabase(t testing.TB) (addr, database string) {
	t.Helper()
	shared.mu.Lock()
	addr, skip, set := shared.addr, shared.skip, shared.set
	shared.mu.Unlock()
	switch {
	case skip != "":
		t.Skip(skip)
	case !set:
		t.Fatal("testenv.NewDatabase: call testenv.RunWithClickHouse from TestMain")
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	database = "t_" + sanitize(t.Name()) + "_" + hex.EncodeToString(rnd[:])

	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 5 * time.Second, MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.Exec(ctx, "CREATE DATABASE `"+database+"`"); err != nil {
		conn.Close()
		t.Fatalf("testenv: create database %s on %s: %v", database, addr, err)
	}
	t.Cleanup(func() {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+database+"`"); err != nil {
			t.Errorf("testenv: drop database %s: %v", database, err)
		}
	})
	return addr, database
}

// sanitize turns a test name into a short lowercase identifier fragment.
func sanitize(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return b.String()
}
