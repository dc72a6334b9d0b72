package query

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query/chserver"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestUsersMatchServerConfig: the users talosd and talosctl log in as by
// default are the ones the private server's users config defines.
func TestUsersMatchServerConfig(t *testing.T) {
	if AdminUser != chserver.AdminUser || WriterUser != chserver.WriterUser || ReaderUser != chserver.ReaderUser {
		t.Fatalf("query users %s/%s/%s, chserver users %s/%s/%s", AdminUser, WriterUser, ReaderUser,
			chserver.AdminUser, chserver.WriterUser, chserver.ReaderUser)
	}
}

// loginAs connects to the test ClickHouse as user.
func loginAs(t *testing.T, ctx context.Context, addr, user string) driver.Conn {
	t.Helper()
	conn, err := Endpoint{Addr: addr, User: user}.Open(ctx, "")
	if err != nil {
		t.Fatalf("log in as %s: %v", user, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// whoami is the user the server runs conn's queries as.
func whoami(t *testing.T, ctx context.Context, conn driver.Conn) string {
	t.Helper()
	var user string
	if err := conn.QueryRow(ctx, "SELECT any(user) FROM system.processes WHERE query LIKE '%talos-whoami%'").Scan(&user); err != nil {
		t.Fatal(err)
	}
	return user
}

// sinkBatch is one batch the sink would write: a decision, an effect and a
// ToolCallEvent for each of n calls.
func sinkBatch(t *testing.T, n int) []schemas.AuditRecord {
	m := newSinkMaker(t)
	var recs []schemas.AuditRecord
	for i := 0; i < n; i++ {
		fx := m.next(t, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	return recs
}

// forbidden runs each statement as conn's user and wants each refused for
// the reason want (the server's words), not for any other.
func forbidden(t *testing.T, ctx context.Context, conn driver.Conn, want string, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		err := conn.Exec(ctx, s)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused with %q", s, err, want)
		}
	}
}

// changes are statements that alter a migrated database: rows (mutations),
// columns, tables, the database.
func changes(db string) []string {
	return []string{
		"ALTER TABLE `" + db + "`.receipts DELETE WHERE 1",
		"ALTER TABLE `" + db + "`.receipts UPDATE decision = 'allow' WHERE 1",
		"ALTER TABLE `" + db + "`.receipts ADD COLUMN forged String",
		"ALTER TABLE `" + db + "`.receipts DROP COLUMN cloudevent",
		"CREATE TABLE `" + db + "`.forged (x UInt8) ENGINE = Memory",
		"TRUNCATE TABLE `" + db + "`.receipts",
		"RENAME TABLE `" + db + "`.receipts TO `" + db + "`.gone",
		"DROP TABLE `" + db + "`.receipts",
		"DROP DATABASE `" + db + "`",
		"CREATE DATABASE `" + db + "_forged`",
	}
}

// TestReaderOnlyReads: the dashboard's and talosctl's user reads the views
// (with the streamed SELECTs' settings), and can neither insert nor change,
// create or drop anything; the rows and the schema are intact after.
func TestReaderOnlyReads(t *testing.T) {
	ctx, addr, admin, db := migratedAt(t)
	if err := NewSinkWriter(admin, db).Write(ctx, sinkBatch(t, 3)); err != nil {
		t.Fatal(err)
	}
	reader := loginAs(t, ctx, addr, ReaderUser)
	if u := whoami(t, ctx, reader); u != ReaderUser {
		t.Fatalf("logged in as %q, want %s", u, ReaderUser)
	}
	var rows []ReceiptRow
	if err := StreamReceipts(ctx, reader, db, func(r ReceiptRow) error { rows = append(rows, r); return nil }); err != nil {
		t.Fatalf("the reader cannot stream receipts: %v", err)
	}
	if len(rows) != 6 {
		t.Fatalf("the reader read %d receipts, want 6", len(rows))
	}
	if _, err := RunCanned(ctx, reader, db, "denials-by-reason", Params{}); err != nil {
		t.Fatalf("the reader cannot run a canned query: %v", err)
	}
	b, err := reader.PrepareBatch(ctx, "INSERT INTO `"+db+"`.schema_migrations ("+schemaMigrationsCols+")")
	if err == nil {
		err = b.Append(uint32(999), "forged")
		if err == nil {
			err = b.Send()
		}
	}
	if err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("the reader inserted: %v", err)
	}
	if err := NewSinkWriter(reader, db).Write(ctx, sinkBatch(t, 1)); err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("the reader wrote a sink batch: %v", err)
	}
	forbidden(t, ctx, reader, "readonly mode", append(changes(db), "SET readonly = 0")...)
	intact(t, ctx, admin, db, 6)
}

// TestWriterInsertsOnly: the sink's user writes a batch with the sink's
// own writer, and can change, create or drop nothing; it cannot turn DDL
// back on either.
func TestWriterInsertsOnly(t *testing.T) {
	ctx, addr, admin, db := migratedAt(t)
	writer := loginAs(t, ctx, addr, WriterUser)
	if u := whoami(t, ctx, writer); u != WriterUser {
		t.Fatalf("logged in as %q, want %s", u, WriterUser)
	}
	w := NewSinkWriter(writer, db)
	if err := w.Write(ctx, sinkBatch(t, 4)); err != nil {
		t.Fatalf("the writer cannot write a sink batch: %v", err)
	}
	if w.Rows() != 12 {
		t.Fatalf("writer stored %d records, want 12", w.Rows())
	}
	forbidden(t, ctx, writer, "DDL queries are prohibited", append(changes(db), "SET allow_ddl = 1")...)
	intact(t, ctx, admin, db, 8)
	if n := count(t, ctx, admin, "SELECT count() FROM `"+db+"`.v_tool_calls"); n != 4 {
		t.Fatalf("%d tool calls stored by the writer, want 4", n)
	}
}

// intact checks, as the admin, that database still holds receipts
// receipts and the schema Migrate made.
func intact(t *testing.T, ctx context.Context, admin driver.Conn, db string, receipts uint64) {
	t.Helper()
	if n := count(t, ctx, admin, "SELECT count() FROM `"+db+"`.v_receipts"); n != receipts {
		t.Errorf("%d receipts after the refused statements, want %d", n, receipts)
	}
	if n := count(t, ctx, admin, "SELECT count() FROM system.columns WHERE database = '"+db+"' AND name IN ('forged', 'cloudevent') AND table = 'receipts'"); n != 1 {
		t.Errorf("receipts columns changed: %d of forged/cloudevent, want only cloudevent", n)
	}
	if n := count(t, ctx, admin, "SELECT count() FROM system.databases WHERE name = '"+db+"_forged'"); n != 0 {
		t.Error("a database was created")
	}
	if v, err := AppliedVersion(ctx, admin, db); err != nil || v != SchemaVersion() {
		t.Errorf("schema version %d (%v), want %d", v, err, SchemaVersion())
	}
}

// TestOpenMigratedAsAdmin: the sink's start migrates a new database as the
// admin (on 18.16 ProvisionUsers has nothing to do: no user is created and
// no password is needed) and hands back a connection as the writer.
func TestOpenMigratedAsAdmin(t *testing.T) {
	addr, db := testenv.NewDatabase(t)
	db += "_new" // not created yet: the admin creates it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := loginAs(t, ctx, addr, AdminUser)
	t.Cleanup(func() { _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS `"+db+"`") })
	l := Logins{Admin: Endpoint{Addr: addr}, Writer: Endpoint{Addr: addr, User: WriterUser}, Reader: Endpoint{Addr: addr, User: ReaderUser}}
	conn, err := OpenMigrated(ctx, l, db, Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if u := whoami(t, ctx, conn); u != WriterUser {
		t.Fatalf("OpenMigrated returned a connection as %q, want %s", u, WriterUser)
	}
	if v, err := AppliedVersion(ctx, admin, db); err != nil || v != SchemaVersion() {
		t.Fatalf("schema version %d (%v), want %d", v, err, SchemaVersion())
	}
	if err := NewSinkWriter(conn, db).Write(ctx, sinkBatch(t, 1)); err != nil {
		t.Fatal(err)
	}
	// Migrating again (a restart) as the admin is harmless.
	again, err := OpenMigrated(ctx, l, db, Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	// The writer cannot stand in for the admin: migrations need DDL.
	l.Admin = l.Writer
	if _, err := OpenMigrated(ctx, l, db+"_w", Cluster{}); err == nil || !strings.Contains(err.Error(), "DDL queries are prohibited") {
		t.Fatalf("migrating as the writer: %v, want refused", err)
	}
}

// migratedAt is migrated with the server's address.
func migratedAt(t *testing.T) (ctx context.Context, addr string, admin driver.Conn, db string) {
	t.Helper()
	addr, db = testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	admin = loginAs(t, ctx, addr, AdminUser)
	if err := Migrate(ctx, admin, db); err != nil {
		t.Fatal(err)
	}
	return ctx, addr, admin, db
}

func TestEndpointPassword(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte("s3cret\r\nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		e       Endpoint
		want    string
		wantErr string
	}{
		{"none", Endpoint{}, "", ""},
		{"flag", Endpoint{Password: "p"}, "p", ""},
		{"file, first line", Endpoint{PasswordFile: file}, "s3cret", ""},
		{"both", Endpoint{Password: "p", PasswordFile: file}, "", "a password and a password file"},
		{"missing file", Endpoint{User: "u", PasswordFile: filepath.Join(dir, "nope")}, "", "clickhouse user u: password file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.e.password()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if err := tc.e.Check(); err == nil {
					t.Fatal("Check passed")
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("password = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestSQLUsers(t *testing.T) {
	for _, tc := range []struct {
		major, minor uint64
		want         bool
	}{{18, 16, false}, {19, 17, false}, {20, 4, false}, {20, 5, true}, {21, 1, true}, {25, 8, true}} {
		if got := SQLUsers(tc.major, tc.minor); got != tc.want {
			t.Errorf("SQLUsers(%d.%d) = %v", tc.major, tc.minor, got)
		}
	}
}

func TestUserStatements(t *testing.T) {
	stmts, err := userStatements("talos", "talos_writer", "pa'ss", "INSERT", false)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("pa'ss"))
	want := []string{
		"CREATE USER IF NOT EXISTS `talos_writer` IDENTIFIED WITH sha256_hash BY '" + hex.EncodeToString(sum[:]) + "'",
		"GRANT INSERT ON `talos`.* TO `talos_writer`",
	}
	if !slices.Equal(stmts, want) {
		t.Fatalf("statements %q, want %q", stmts, want)
	}
	if strings.Contains(strings.Join(stmts, ";"), "pa'ss") {
		t.Fatal("the password itself is in the SQL")
	}
	stmts, err = userStatements("talos", "talos_reader", "", "SELECT", true)
	if err != nil || len(stmts) != 1 || stmts[0] != "GRANT SELECT ON `talos`.* TO `talos_reader`" {
		t.Fatalf("an existing user: %q, %v", stmts, err)
	}
	for _, tc := range []struct{ db, name, password, want string }{
		{"talos", "talos_reader", "", "only with a password"},
		{"talos", "Robert'); DROP", "x", "create it on the server"},
		{"ta-los", "talos_reader", "x", "invalid database name"},
	} {
		if _, err := userStatements(tc.db, tc.name, tc.password, "SELECT", false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("userStatements(%q, %q): %v, want %q", tc.db, tc.name, err, tc.want)
		}
	}
}

// TestEndpointTLS runs a private ClickHouse that serves the native
// protocol over TLS and asks for a client certificate: a login with the
// CA and a client certificate works; without the certificate, with the
// wrong CA or server name, or in plain TCP to the secure port, none does.
func TestEndpointTLS(t *testing.T) {
	if _, err := chserver.Find(); err != nil {
		t.Fatal(err) // scripts/test.sh installs it
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := chserver.Start(ctx, chserver.Options{TLS: true, ClientCerts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Stop()
	files := ch.TLSFiles()
	good := TLS{CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey}
	conn, err := Endpoint{Addr: ch.SecureAddr(), User: ReaderUser, TLS: good}.Open(ctx, "")
	if err != nil {
		t.Fatalf("TLS login: %v", err)
	}
	if u := whoami(t, ctx, conn); u != ReaderUser {
		t.Fatalf("logged in as %q over TLS", u)
	}
	conn.Close()
	other := good
	other.CAFile = otherCA(t)
	wrongName := good
	wrongName.ServerName = "clickhouse.example"
	noCert := TLS{CAFile: files.CA}
	for _, tc := range []struct {
		name string
		tls  TLS
		want string
	}{
		{"plain TCP to the secure port", TLS{}, "handshake"},
		// TLS 1.3: the server's refusal may come as its alert or as a reset.
		{"no client certificate", noCert, "certificate required|connection reset|broken pipe"},
		{"a CA that did not sign the server's certificate", other, "certificate signed by unknown authority"},
		{"another server name", wrongName, "clickhouse.example"},
		{"the system's roots", TLS{Enabled: true}, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			conn, err := Endpoint{Addr: ch.SecureAddr(), User: ReaderUser, TLS: tc.tls}.Open(ctx, "")
			if err == nil {
				conn.Close()
				t.Fatal("connected")
			}
			if !regexp.MustCompile(tc.want).MatchString(err.Error()) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
	// The plaintext port still serves plain TCP.
	plain := loginAs(t, ctx, ch.Addr(), ReaderUser)
	if u := whoami(t, ctx, plain); u != ReaderUser {
		t.Fatalf("logged in as %q in plain TCP", u)
	}
}

// otherCA writes a CA certificate that signed nothing the server has.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOpenHints: the commonest connection mistakes fail with the driver's
// error and a hint that names the fix: ClickHouse's HTTP port given for
// the native one (it leaves the native hello unanswered; an HTTP server
// that rejects it at once answers 'H'), and a database that does not
// exist, which a server limiting its users to some databases (as talosd
// dev's does) answers by closing the connection.
func TestOpenHints(t *testing.T) {
	if _, err := testenv.FindClickHouse(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	httpPort := testenv.FreePort(t)
	srv, err := testenv.StartClickHouse(ctx, testenv.ClickHouseOptions{Dir: t.TempDir(), HTTPPort: httpPort, Databases: []string{"talos"}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	for _, tc := range []struct {
		name, addr, user, database string
		driver, hint               string
	}{
		{"ClickHouse's HTTP port", net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)), AdminUser, "", "i/o timeout", "did not answer the handshake: talosctl and talosd speak ClickHouse's native protocol, on port 9000"},
		{"an HTTP server", badRequests(t), AdminUser, "", "unexpected packet [72]", "looks like an HTTP port: talosctl and talosd speak ClickHouse's native protocol, on port 9000"},
		{"no such database", srv.Addr(), ReaderUser, "nosuchdb", "EOF", "database nosuchdb may not exist, or user talos_reader may not access it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := Endpoint{Addr: tc.addr, User: tc.user}.Open(ctx, tc.database)
			if err == nil {
				conn.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.driver) || !strings.Contains(err.Error(), tc.hint) {
				t.Fatalf("err %v: want the driver's %q and the hint %q", err, tc.driver, tc.hint)
			}
		})
	}
}

// badRequests is the address of an HTTP server that, as most do, answers
// a request it cannot parse with 400 at once; it stops when t ends.
func badRequests(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	return ln.Addr().String()
}
