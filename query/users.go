package query

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// SQLUsers reports whether ClickHouse major.minor manages users and
// grants in SQL (CREATE USER, GRANT): 20.5 and later. Older servers —
// Debian's 18.16 among them — define users only in their users config.
func SQLUsers(major, minor uint64) bool { return major > 20 || major == 20 && minor >= 5 }

// ProvisionUsers gives the writer and the reader of l their rights on
// database, on a server with SQL user management (SQLUsers): a user the
// server lacks is created with its password's SHA-256 (the password
// itself never travels), then granted INSERT (writer) or SELECT (reader)
// on database.* and nothing else. A user the server's users config
// defines (read-only to SQL) is left as it is, and so is a login that is
// the admin's own. conn MUST be the admin's, allowed to manage users
// (access_management). On an older server it does nothing: there the
// users config provides the users (DESIGN.md).
func ProvisionUsers(ctx context.Context, conn driver.Conn, database string, l Logins) error {
	v, err := conn.ServerVersion()
	if err != nil {
		return fmt.Errorf("query: server version: %w", err)
	}
	if !SQLUsers(v.Version.Major, v.Version.Minor) {
		return nil
	}
	for _, u := range []struct {
		login Endpoint
		grant string
	}{{l.Writer, "INSERT"}, {l.Reader, "SELECT"}} {
		if u.login.user() == l.Admin.user() {
			continue
		}
		if err := provisionUser(ctx, conn, database, u.login, u.grant); err != nil {
			return err
		}
	}
	return nil
}

// provisionUser creates login's user when the server lacks it and grants
// it grant on database.*.
func provisionUser(ctx context.Context, conn driver.Conn, database string, login Endpoint, grant string) error {
	name := login.user()
	storages, err := selectAll(ctx, conn, "users", "SELECT storage FROM system.users WHERE name = ?",
		func(r driver.Rows, s *string) error { return r.Scan(s) }, name)
	if err != nil {
		return err
	}
	var password string
	if len(storages) == 0 {
		if password, err = login.password(); err != nil {
			return err
		}
	} else if strings.Contains(storages[0], "xml") { // users.xml: not ours to change
		return nil
	}
	stmts, err := userStatements(database, name, password, grant, len(storages) > 0)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("query: clickhouse user %s: %s: %w", name, strings.SplitN(s, " BY ", 2)[0], err)
		}
	}
	return nil
}

// userStatements are the SQL that creates user name (unless it exists)
// and grants it grant on database.*. Names are spliced into the SQL, so
// only valid names pass; the password appears only as its SHA-256.
func userStatements(database, name, password, grant string, exists bool) ([]string, error) {
	if !ValidName(database) {
		return nil, fmt.Errorf("query: invalid database name %q", database)
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("query: clickhouse user %q: migrations create and grant only users named like talos_writer; create it on the server", name)
	}
	var stmts []string
	if !exists {
		if password == "" {
			return nil, fmt.Errorf("query: clickhouse user %s does not exist, and migrations create users only with a password: give its password (DESIGN.md, ClickHouse users)", name)
		}
		sum := sha256.Sum256([]byte(password))
		stmts = append(stmts, "CREATE USER IF NOT EXISTS `"+name+"` IDENTIFIED WITH sha256_hash BY '"+hex.EncodeToString(sum[:])+"'")
	}
	return append(stmts, "GRANT "+grant+" ON `"+database+"`.* TO `"+name+"`"), nil
}
