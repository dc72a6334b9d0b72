package query

// The ClickHouse flags of talosd (ServiceFlags) and talosctl
// (ClientFlags), defined once here: the binaries embed these structs in
// their own, so each flag also reads TALOS_<FLAG>. kong calls Validate
// once the flags are parsed.

// TLSFlags are the ClickHouse TLS flags both binaries share.
type TLSFlags struct {
	ClickhouseTLS        bool   `name:"clickhouse-tls" help:"Connect to ClickHouse over TLS (its secure native port, tcp_port_secure, usually 9440), verifying its certificate; implied by the other --clickhouse-ca/-cert/-key/-server-name flags."`
	ClickhouseCA         string `name:"clickhouse-ca" type:"path" help:"CA certificates (PEM) that sign the ClickHouse server's certificate (default: the system's)."`
	ClickhouseCert       string `name:"clickhouse-cert" type:"path" help:"Client certificate (PEM), for a ClickHouse server that asks for one; needs --clickhouse-key."`
	ClickhouseKey        string `name:"clickhouse-key" type:"path" help:"Key (PEM) of --clickhouse-cert."`
	ClickhouseServerName string `name:"clickhouse-server-name" help:"Name the ClickHouse server's certificate must carry (default: the host of --clickhouse-addr)."`
}

// TLS is the flags' TLS setting.
func (f TLSFlags) TLS() TLS {
	return TLS{Enabled: f.ClickhouseTLS, CAFile: f.ClickhouseCA, CertFile: f.ClickhouseCert, KeyFile: f.ClickhouseKey, ServerName: f.ClickhouseServerName}
}

// ClientFlags are talosctl's ClickHouse flags: one login, a reader by
// default.
type ClientFlags struct {
	ClickhouseAddr         string `name:"clickhouse-addr" default:"127.0.0.1:9000" help:"ClickHouse native address HOST:PORT, or the replicas of a cluster comma-separated (the first that answers)."`
	ClickhouseDatabase     string `name:"clickhouse-database" default:"talos" help:"ClickHouse database."`
	ClickhouseUser         string `name:"clickhouse-user" default:"talos_reader" help:"ClickHouse user. query, verify, export, bench and conformance only read; synth writes and creates its database, so it needs an admin (default)."`
	ClickhousePassword     string `name:"clickhouse-password" help:"Password of --clickhouse-user (prefer TALOS_CLICKHOUSE_PASSWORD or --clickhouse-password-file: arguments are visible to other local users)."`
	ClickhousePasswordFile string `name:"clickhouse-password-file" type:"path" help:"File whose first line is the password of --clickhouse-user."`
	TLSFlags
}

// Endpoint is the login of the flags.
func (f ClientFlags) Endpoint() Endpoint {
	return Endpoint{Addr: f.ClickhouseAddr, User: f.ClickhouseUser, Password: f.ClickhousePassword, PasswordFile: f.ClickhousePasswordFile, TLS: f.TLS()}
}

// Validate reads the password and TLS files the flags name.
func (f ClientFlags) Validate() error { return f.Endpoint().Check() }

// ServiceFlags are talosd's ClickHouse flags: the sink inserts as the
// writer after migrating as the admin; the web role and `talosd dev`'s
// check read as the reader.
type ServiceFlags struct {
	ClickhouseAddr               string `name:"clickhouse-addr" help:"ClickHouse native address HOST:PORT (sink and web roles), or the replicas of a cluster comma-separated: each connection goes to the first that answers. In dev, empty starts a private clickhouse-server."`
	ClickhouseCluster            string `name:"clickhouse-cluster" help:"ClickHouse cluster (a name of the servers' remote_servers) the sink's migrations run ON CLUSTER, creating replicated tables (DESIGN.md §4); empty: one server."`
	ClickhouseInsertQuorum       int    `name:"clickhouse-insert-quorum" default:"0" help:"With --clickhouse-cluster: an insert succeeds only once this many replicas hold it (ClickHouse's insert_quorum; 0: once one does, the others fetch it). 2 on two replicas stops the sink while one is down."`
	ClickhouseDatabase           string `name:"clickhouse-database" default:"talos" help:"ClickHouse database."`
	ClickhouseUser               string `name:"clickhouse-user" default:"talos_writer" help:"ClickHouse user of the sink role: it inserts."`
	ClickhousePassword           string `name:"clickhouse-password" help:"Password of --clickhouse-user (prefer TALOS_CLICKHOUSE_PASSWORD or the -file flag: arguments are visible to other local users)."`
	ClickhousePasswordFile       string `name:"clickhouse-password-file" type:"path" help:"File whose first line is the password of --clickhouse-user."`
	ClickhouseReaderUser         string `name:"clickhouse-reader-user" default:"talos_reader" help:"ClickHouse user of the web role: it reads."`
	ClickhouseReaderPassword     string `name:"clickhouse-reader-password" help:"Password of --clickhouse-reader-user (prefer TALOS_CLICKHOUSE_READER_PASSWORD or the -file flag)."`
	ClickhouseReaderPasswordFile string `name:"clickhouse-reader-password-file" type:"path" help:"File whose first line is the password of --clickhouse-reader-user."`
	ClickhouseAdminUser          string `name:"clickhouse-admin-user" default:"default" help:"ClickHouse user the sink role migrates the database as, at start; on ClickHouse 20.5 or later it also creates the sink's and the web role's users (with their passwords) and grants them INSERT and SELECT on the database."`
	ClickhouseAdminPassword      string `name:"clickhouse-admin-password" help:"Password of --clickhouse-admin-user (prefer TALOS_CLICKHOUSE_ADMIN_PASSWORD or the -file flag)."`
	ClickhouseAdminPasswordFile  string `name:"clickhouse-admin-password-file" type:"path" help:"File whose first line is the password of --clickhouse-admin-user."`
	TLSFlags
}

// Logins are the flags' three logins.
func (f ServiceFlags) Logins() Logins {
	login := func(user, password, file string) Endpoint {
		return Endpoint{Addr: f.ClickhouseAddr, User: user, Password: password, PasswordFile: file, TLS: f.TLS()}
	}
	return Logins{
		Admin:  login(f.ClickhouseAdminUser, f.ClickhouseAdminPassword, f.ClickhouseAdminPasswordFile),
		Writer: login(f.ClickhouseUser, f.ClickhousePassword, f.ClickhousePasswordFile),
		Reader: login(f.ClickhouseReaderUser, f.ClickhouseReaderPassword, f.ClickhouseReaderPasswordFile),
	}
}

// Cluster is where the sink's migrations run and how it inserts.
func (f ServiceFlags) Cluster() Cluster {
	return Cluster{Name: f.ClickhouseCluster, InsertQuorum: f.ClickhouseInsertQuorum}
}

// Reader is the login of the web role.
func (f ServiceFlags) Reader() Endpoint { return f.Logins().Reader }

// Validate reads the password and TLS files the flags name.
func (f ServiceFlags) Validate() error {
	if err := f.Cluster().Check(); err != nil {
		return err
	}
	l := f.Logins()
	for _, e := range []Endpoint{l.Admin, l.Writer, l.Reader} {
		if err := e.Check(); err != nil {
			return err
		}
	}
	return nil
}
