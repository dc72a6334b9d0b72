package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/query"
)

// TestComposeMatchesFlags keeps docker-compose.yml honest without a Docker
// engine: every TALOS_* variable it sets must be the environment variable
// of a talosd flag, and the values it gives to enum flags must parse.
func TestComposeMatchesFlags(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c cli
	parser, err := kong.New(&c, kong.DefaultEnvars("TALOS"), kong.Bind(&c.Flags))
	if err != nil {
		t.Fatal(err)
	}
	envs := map[string]bool{}
	for _, f := range parser.Model.Flags {
		for _, e := range f.Envs {
			envs[e] = true
		}
	}
	if !envs["TALOS_NATS_URL"] || !envs["TALOS_SIGNING_KEY"] {
		t.Fatalf("flag model lacks the DESIGN.md variables: %v", envs)
	}
	set := regexp.MustCompile(`(?m)^\s+(TALOS_[A-Z_]+):\s*(.*)$`).FindAllStringSubmatch(string(raw), -1)
	if len(set) < 8 {
		t.Fatalf("found only %d TALOS_* settings in docker-compose.yml", len(set))
	}
	// The talosctl tools service may also set talosctl's own variables.
	tools := ""
	if i := strings.Index(string(raw), "\n  talosctl:\n"); i >= 0 {
		tools = string(raw)[i:]
		if j := strings.Index(tools, "\nvolumes:"); j >= 0 {
			tools = tools[:j]
		}
	}
	talosctlOnly := map[string]bool{"TALOS_RESPONDER_KEY": true, "TALOS_LOG_URL": true}
	env := map[string]string{}
	for _, m := range set {
		if talosctlOnly[m[1]] {
			if !strings.Contains(tools, m[0]) {
				t.Errorf("docker-compose.yml sets talosctl's %s outside the talosctl service", m[1])
			}
			continue
		}
		if !envs[m[1]] {
			t.Errorf("docker-compose.yml sets %s, which is no talosd flag", m[1])
		}
		// The first setting of a variable is the shared x-talosd one;
		// services override some (the web service's TALOS_ROLES).
		if _, seen := env[m[1]]; !seen {
			env[m[1]] = strings.Trim(m[2], `"`)
		}
	}
	if !strings.Contains(string(raw), "TALOS_ROLES: web\n") {
		t.Error("docker-compose.yml has no dashboard service (TALOS_ROLES: web)")
	}
	// The values parse as talosd would read them. Password files are read
	// at parse: a stand-in replaces the volume's file.
	standIn := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(standIn, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	chCA, err := natstls.Ensure(t.TempDir(), []string{"clickhouse"}) // stands for the chtls job's
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range env {
		switch {
		case strings.HasSuffix(k, "_PASSWORD_FILE"):
			v = standIn
		case k == "TALOS_CLICKHOUSE_CA":
			v = chCA.CA
		}
		t.Setenv(k, v)
	}
	if _, err := parser.Parse([]string{"run"}); err != nil {
		t.Fatalf("talosd rejects the compose environment: %v", err)
	}
	if c.Mode != "prod" || strings.Join(c.Roles, ",") != "enforce,sink,control,log" || len(c.ResponderKeys) != 1 || c.Replicas != 3 || c.ChainCheckpoints {
		t.Fatalf("compose environment parsed as mode %q roles %v replicas %d chain checkpoints %v", c.Mode, c.Roles, c.Replicas, c.ChainCheckpoints)
	}
}

// TestComposeGrafana keeps the grafana service of docker-compose.yml in
// step with deploy/grafana: the plugin the provisioned data source needs,
// the directories it mounts (which must exist), the home dashboard, and
// the ClickHouse service and port the data source points at.
func TestComposeGrafana(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	svc := composeService(t, string(raw), "grafana")
	for _, want := range []string{
		"image: grafana/grafana:",
		"GF_INSTALL_PLUGINS: grafana-clickhouse-datasource",
		"clickhouse: { condition: service_healthy }",
		`ports: ["3000:3000"]`,
	} {
		if !strings.Contains(svc, want) {
			t.Errorf("grafana service lacks %q:\n%s", want, svc)
		}
	}
	mounts := regexp.MustCompile(`(?m)^\s+- \./(deploy/grafana/[a-z/]+):(/\S+?)(:ro)?$`).FindAllStringSubmatch(svc, -1)
	targets := map[string]string{}
	for _, m := range mounts {
		if st, err := os.Stat("../../" + m[1]); err != nil || !st.IsDir() {
			t.Errorf("grafana mounts ./%s, which is not a directory of the repository (%v)", m[1], err)
		}
		targets[m[2]] = m[1]
	}
	if targets["/etc/grafana/provisioning"] != "deploy/grafana/provisioning" || targets["/var/lib/grafana/dashboards"] != "deploy/grafana/dashboards" {
		t.Errorf("grafana mounts %v; want deploy/grafana/provisioning and deploy/grafana/dashboards", targets)
	}
	home := regexp.MustCompile(`GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH: /var/lib/grafana/dashboards/(\S+)`).FindStringSubmatch(svc)
	if home == nil {
		t.Error("grafana has no home dashboard")
	} else if _, err := os.Stat("../../deploy/grafana/dashboards/" + home[1]); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	ds, err := os.ReadFile("../../deploy/grafana/provisioning/datasources/talos-clickhouse.yaml")
	if err != nil {
		t.Fatal(err)
	}
	host := regexp.MustCompile(`(?m)^\s+host: (\S+)$`).FindStringSubmatch(string(ds))
	port := regexp.MustCompile(`(?m)^\s+port: (\d+)$`).FindStringSubmatch(string(ds))
	if host == nil || port == nil {
		t.Fatalf("the data source names no host or port:\n%s", ds)
	}
	ch := composeService(t, string(raw), host[1])
	if !strings.Contains(ch, `"`+port[1]+":"+port[1]+`"`) {
		t.Errorf("the data source uses %s:%s, which the %s service does not serve:\n%s", host[1], port[1], host[1], ch)
	}
	if !strings.Contains(string(ds), "defaultDatabase: talos") || !strings.Contains(string(raw), "TALOS_CLICKHOUSE_DATABASE: talos") {
		t.Error("the data source and talosd use different databases")
	}
}

// composeServices are the services of docker-compose.yml as compose reads
// them (YAML merge keys applied): environment and volume mounts.
type composeServices map[string]struct {
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Ports       []string          `yaml:"ports"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// readComposeServices reads docker-compose.yml's services.
func readComposeServices(t *testing.T) composeServices {
	t.Helper()
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services composeServices `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Services
}

// mounts maps a service's mount targets to their named volumes.
func (s composeServices) mounts(name string) map[string]string {
	m := map[string]string{}
	for _, v := range s[name].Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && !strings.HasPrefix(parts[0], ".") {
			m[parts[1]] = parts[0]
		}
	}
	return m
}

// TestComposeClickHouseUsers keeps docker-compose.yml least-privilege on
// ClickHouse: the workers' sinks insert as the writer after migrating as
// the ClickHouse service's admin; the dashboard, talosctl and Grafana read
// as the reader and mount only the reader's password; every password file
// a service names is one the chsecrets job writes, on a volume the
// service mounts.
func TestComposeClickHouseUsers(t *testing.T) {
	svc := readComposeServices(t)
	admin := svc["clickhouse"].Environment["CLICKHOUSE_USER"]
	if admin == "" || admin == "default" || svc["clickhouse"].Environment["CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT"] != "1" {
		t.Fatalf("the ClickHouse service's admin %q: want a named user with access management", admin)
	}
	if !strings.Contains(strings.Join(svc["clickhouse"].Entrypoint, " "), "/chsecrets/admin.password") || svc.mounts("clickhouse")["/chsecrets"] != "chsecrets" {
		t.Errorf("the ClickHouse service does not take the admin password from chsecrets: %v", svc["clickhouse"].Entrypoint)
	}
	job := strings.Join(svc["chsecrets"].Command, "\n")
	written := map[string]bool{} // volume/file the job writes
	if strings.Contains(job, "for u in admin writer reader") && strings.Contains(job, ">/chsecrets/$$u.password") &&
		svc.mounts("chsecrets")["/chsecrets"] == "chsecrets" {
		written["chsecrets/admin.password"], written["chsecrets/writer.password"], written["chsecrets/reader.password"] = true, true, true
	}
	if strings.Contains(job, "cp /chsecrets/reader.password /chreader/reader.password") && svc.mounts("chsecrets")["/chreader"] == "chreader" {
		written["chreader/reader.password"] = true
	}
	logins := map[string]struct{ user, roles string }{
		"worker1": {query.WriterUser, "enforce,sink,control,log"}, "worker2": {query.WriterUser, "enforce,sink,control,log"},
		"web": {"", "web"}, "talosctl": {query.ReaderUser, ""},
	}
	for name, want := range logins {
		env := svc[name].Environment
		if env["TALOS_CLICKHOUSE_USER"] != want.user || env["TALOS_ROLES"] != want.roles {
			t.Errorf("%s: user %q roles %q, want %q %q", name, env["TALOS_CLICKHOUSE_USER"], env["TALOS_ROLES"], want.user, want.roles)
		}
		sink := strings.Contains(want.roles, "sink")
		if sink && (env["TALOS_CLICKHOUSE_ADMIN_USER"] != admin || env["TALOS_CLICKHOUSE_READER_USER"] != query.ReaderUser) {
			t.Errorf("%s migrates as %q creating reader %q; want %s and %s", name, env["TALOS_CLICKHOUSE_ADMIN_USER"], env["TALOS_CLICKHOUSE_READER_USER"], admin, query.ReaderUser)
		}
		if !sink && svc.mounts(name)["/chsecrets"] != "" {
			t.Errorf("%s only reads, yet mounts the admin's and writer's passwords", name)
		}
		for k, file := range env {
			if !strings.HasSuffix(k, "_PASSWORD_FILE") || !strings.HasPrefix(k, "TALOS_CLICKHOUSE_") {
				continue
			}
			volume := svc.mounts(name)[path.Dir(file)]
			login := strings.TrimSuffix(strings.TrimPrefix(k, "TALOS_CLICKHOUSE_"), "PASSWORD_FILE")
			user := map[string]string{"": "writer", "ADMIN_": "admin", "READER_": "reader"}[login]
			if name == "talosctl" {
				user = "reader"
			}
			if !written[volume+"/"+path.Base(file)] || path.Base(file) != user+".password" {
				t.Errorf("%s: %s=%s is not the %s password the chsecrets job writes on a volume %s mounts", name, k, file, user, name)
			}
		}
	}
	if svc.mounts("grafana")["/chreader"] != "chreader" || svc.mounts("grafana")["/chsecrets"] != "" {
		t.Errorf("grafana mounts %v; want chreader (the reader's password) only", svc.mounts("grafana"))
	}
}

// TestComposeTransparencyLog keeps docker-compose.yml's transparency log
// whole (DESIGN.md §3): both workers run the log role on one shared log
// directory (<data dir>/tlog, a named volume the image creates for the
// nonroot user) with one log key, which a job creates once on a volume
// they mount; they cut no chain checkpoints (the log's replace them); and
// talosctl holds ClickHouse to the log a worker serves, with the key's
// verifier key.
func TestComposeTransparencyLog(t *testing.T) {
	svc := readComposeServices(t)
	job := svc["logkey"].Command
	i := slices.Index(job, "--data-dir")
	if len(job) == 0 || job[0] != "log-key" || i < 0 || i+1 >= len(job) || !slices.Contains(job, "--log-origin") {
		t.Fatalf("the logkey job runs %v; want talosd log-key --data-dir DIR --log-origin ORIGIN", job)
	}
	keyDir := job[i+1]
	keyVolume := svc.mounts("logkey")[keyDir]
	if keyVolume == "" {
		t.Fatalf("the logkey job writes %s on no volume", keyDir)
	}
	logVolume := ""
	for _, w := range []string{"worker1", "worker2"} {
		env := svc[w].Environment
		if !slices.Contains(strings.Split(env["TALOS_ROLES"], ","), "log") || env["TALOS_CHAIN_CHECKPOINTS"] != "false" {
			t.Errorf("%s: roles %q, chain checkpoints %q; want the log role and none", w, env["TALOS_ROLES"], env["TALOS_CHAIN_CHECKPOINTS"])
		}
		if env["TALOS_LOG_KEY"] != keyDir+"/keys/log.key" || !strings.HasPrefix(svc.mounts(w)[keyDir], keyVolume) {
			t.Errorf("%s: log key %q on %v; want %s/keys/log.key on the %s volume", w, env["TALOS_LOG_KEY"], svc.mounts(w), keyDir, keyVolume)
		}
		v := svc.mounts(w)[env["TALOS_DATA_DIR"]+"/tlog"]
		if v == "" || (logVolume != "" && v != logVolume) {
			t.Errorf("%s: %s/tlog is volume %q; want one volume both workers share", w, env["TALOS_DATA_DIR"], v)
		}
		logVolume = v
	}
	ctl := svc["talosctl"].Environment
	u, err := url.Parse(ctl["TALOS_LOG_URL"])
	if err != nil || svc[u.Hostname()].Environment["TALOS_ROLES"] == "" || !strings.HasSuffix(svc[u.Hostname()].Environment["TALOS_HTTP_ADDR"], ":"+u.Port()) {
		t.Errorf("talosctl's log URL %q is not a worker's --http-addr", ctl["TALOS_LOG_URL"])
	}
	if ctl["TALOS_LOG_KEY"] != keyDir+"/keys/log.vkey" || svc.mounts("talosctl")[keyDir] != keyVolume {
		t.Errorf("talosctl's log key %q: want the verifier key %s/keys/log.vkey on the %s volume", ctl["TALOS_LOG_KEY"], keyDir, keyVolume)
	}
	docker, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{keyDir, svc["worker1"].Environment["TALOS_DATA_DIR"]} {
		if !strings.Contains(string(docker), "COPY --from=build --chown=65532:65532 /out"+dir+" "+dir+"\n") {
			t.Errorf("the Dockerfile does not create %s for the nonroot user (a named volume mounted there would be root's)", dir)
		}
	}
	if !strings.Contains(string(docker), "/out/data/tlog") {
		t.Error("the Dockerfile does not create /data/tlog, where the shared log volume is mounted")
	}
}

// composeService returns the text of one top-level service of
// docker-compose.yml (up to the next service or top-level key).
func composeService(t *testing.T, compose, name string) string {
	t.Helper()
	i := strings.Index(compose, "\n  "+name+":\n")
	if i < 0 {
		t.Fatalf("docker-compose.yml has no %s service", name)
	}
	rest := compose[i+1:]
	if j := regexp.MustCompile(`\n(  [a-z0-9_-]+:\n|[a-z]+:)`).FindStringIndex(rest[1:]); j != nil {
		rest = rest[:j[0]+1]
	}
	return rest
}

// TestComposeNATSTLS keeps the NATS cluster's TLS in docker-compose.yml
// consistent without a Docker engine. It runs the natstls and natsauth
// jobs' talosd commands, as compose gives them, into a directory standing
// for their shared volume; nats-server reads deploy/nats.conf over that
// volume with TLS required of clients and mutual TLS on the routes; and the
// certificate it serves verifies, against the CA file that talosd and
// talosctl are told to trust (TALOS_NATS_CA, on the same volume), for every
// host their TALOS_NATS_URL names and every route.
func TestComposeNATSTLS(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	compose := string(raw)
	const volume = "natsauth" // the volume every NATS secret is in
	root := t.TempDir()       // stands for /etc/nats of the NATS services
	vol := filepath.Join(root, "secrets")

	// The one-shot jobs, run as talosd would run them.
	for _, job := range []string{"natsauth", "natstls"} {
		svc := composeService(t, compose, job)
		at := mountOf(t, svc, volume)
		m := regexp.MustCompile(`(?m)^\s+command: (\[.*\])$`).FindStringSubmatch(svc)
		var args []string
		if m == nil || json.Unmarshal([]byte(m[1]), &args) != nil {
			t.Fatalf("%s job: no command:\n%s", job, svc)
		}
		for i := range args {
			args[i] = strings.Replace(args[i], at, vol, 1)
		}
		var c cli
		parser, err := kong.New(&c, kong.DefaultEnvars("TALOS"), kong.Bind(&c.Flags))
		if err != nil {
			t.Fatal(err)
		}
		ctx, err := parser.Parse(args)
		if err != nil {
			t.Fatalf("%s job: talosd %v: %v", job, args, err)
		}
		if err := ctx.Run(&c.Flags, c.Server(c.DataDir)); err != nil {
			t.Fatalf("%s job: talosd %v: %v", job, args, err)
		}
	}

	// Every NATS node starts only after both jobs, with the volume and
	// deploy/nats.conf where the configuration expects them.
	nats1 := composeBlock(t, compose, "\n  nats1: &nats\n", "\n  nats2:\n")
	for _, want := range []string{"natsauth: { condition: service_completed_successfully }", "natstls: { condition: service_completed_successfully }",
		`"./deploy/nats.conf:/etc/nats/nats.conf:ro"`} {
		if !strings.Contains(nats1, want) {
			t.Errorf("nats1 lacks %s:\n%s", want, nats1)
		}
	}
	if at := mountOf(t, nats1, volume); at != "/etc/nats/secrets" {
		t.Fatalf("nats1 mounts %s at %s, want /etc/nats/secrets", volume, at)
	}
	conf, err := os.ReadFile("../../deploy/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(root, "nats.conf")
	if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(conf), "/etc/nats/", root+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(local)
	if err != nil {
		t.Fatalf("nats-server rejects deploy/nats.conf with the jobs' files: %v", err)
	}
	if opts.TLSConfig == nil || len(opts.TLSConfig.Certificates) != 1 {
		t.Fatal("deploy/nats.conf does not require TLS of clients")
	}
	if c := opts.Cluster.TLSConfig; c == nil || c.ClientAuth != tls.RequireAndVerifyClientCert || c.RootCAs == nil {
		t.Fatal("deploy/nats.conf's routes are not mutual TLS")
	}
	if !opts.Cluster.NoAdvertise {
		t.Error("the cluster advertises container addresses its certificate does not name")
	}
	leaf, err := x509.ParseCertificate(opts.TLSConfig.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}

	// What the clients trust and the hosts they reach.
	talosd := composeBlock(t, compose, "x-talosd:", "\nservices:")
	talosctl := composeService(t, compose, "talosctl")
	var hosts []string
	for _, r := range opts.Routes {
		hosts = append(hosts, r.Hostname())
	}
	for name, svc := range map[string]string{"x-talosd": talosd, "talosctl": talosctl} {
		ca := regexp.MustCompile(`TALOS_NATS_CA: (\S+)`).FindStringSubmatch(svc)
		urls := regexp.MustCompile(`TALOS_NATS_URL: (\S+)`).FindStringSubmatch(svc)
		if ca == nil || urls == nil {
			t.Fatalf("%s sets no TALOS_NATS_CA or TALOS_NATS_URL", name)
		}
		at := mountOf(t, svc, volume)
		if !strings.HasPrefix(ca[1], at+"/") {
			t.Fatalf("%s: TALOS_NATS_CA %s is not on the %s volume (mounted at %s)", name, ca[1], volume, at)
		}
		pem, err := os.ReadFile(filepath.Join(vol, strings.TrimPrefix(ca[1], at+"/")))
		if err != nil {
			t.Fatalf("%s: TALOS_NATS_CA %s is no file the natstls job writes: %v", name, ca[1], err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		for _, u := range strings.Split(urls[1], ",") {
			p, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			hosts = append(hosts, p.Hostname())
		}
		for _, h := range hosts {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s: the NATS certificate does not verify for %s (%v): %v", name, h, usage, err)
				}
			}
		}
	}
	if len(hosts) < 6 {
		t.Fatalf("checked only the hosts %v", hosts)
	}
}

// mountOf is where a compose service mounts the named volume.
func mountOf(t *testing.T, svc, volume string) string {
	t.Helper()
	m := regexp.MustCompile(`["\s]` + volume + `:(/[^":\s]*)`).FindStringSubmatch(svc)
	if m == nil {
		t.Fatalf("no mount of volume %s in:\n%s", volume, svc)
	}
	return m[1]
}

// composeBlock is the text of docker-compose.yml from start up to end.
func composeBlock(t *testing.T, compose, start, end string) string {
	t.Helper()
	i := strings.Index(compose, start)
	j := strings.Index(compose, end)
	if i < 0 || j < i {
		t.Fatalf("docker-compose.yml has no %q … %q", start, end)
	}
	return compose[i:j]
}

// chReplicas are docker-compose's ClickHouse services, the replicas of
// its cluster, in the order clients are given them.
var chReplicas = []string{"clickhouse", "clickhouse2"}

// TestComposeClickHouseTLS keeps docker-compose's ClickHouse TLS-only: the
// chtls job's command makes a certificate for each replica's host name
// that its CA verifies; each replica serves it on 9440 only (its plaintext
// ports closed, only 9440 published); every client connects to 9440 of
// every replica trusting that CA, from the volume it mounts.
func TestComposeClickHouseTLS(t *testing.T) {
	svc := readComposeServices(t)
	job := svc["chtls"].Command
	if len(job) != 5 || job[0] != "nats-tls" || job[1] != "--data-dir" || job[3] != "--nats-tls-hosts" ||
		!slices.Equal(strings.Split(job[4], ","), chReplicas) || svc.mounts("chtls")[job[2]] != "chtls" {
		t.Fatalf("the chtls job %v does not write a certificate for %v on the chtls volume", job, chReplicas)
	}
	files, err := natstls.Ensure(filepath.Join(t.TempDir(), "nats-tls"), chReplicas) // as the job runs it
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(files.CA)
	pool.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	var addrs []string
	for i, name := range chReplicas {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Fatalf("the job's certificate does not verify for %s: %v", name, err)
		}
		addrs = append(addrs, name+":9440")
		ch := svc[name]
		entry := strings.Join(ch.Entrypoint, " ")
		for _, want := range []string{"/chtls/nats-tls/server.pem", "/chtls/nats-tls/server.key", "/etc/clickhouse-server/tls/", "exec /entrypoint.sh"} {
			if !strings.Contains(entry, want) {
				t.Errorf("the %s entrypoint lacks %s: %s", name, want, entry)
			}
		}
		if svc.mounts(name)["/chtls"] != "chtls" || !slices.Contains(ch.Volumes, "./deploy/clickhouse/tls.xml:/etc/clickhouse-server/config.d/tls.xml:ro") {
			t.Errorf("the %s service mounts %v", name, ch.Volumes)
		}
		if want := fmt.Sprintf("%d:9440", 9440+i); len(ch.Ports) != 1 || ch.Ports[0] != want {
			t.Errorf("the %s service publishes %v, want only %s", name, ch.Ports, want)
		}
		if hc := strings.Join(ch.Healthcheck.Test, " "); !strings.Contains(hc, "-C /etc/clickhouse-server/client-tls.xml") {
			t.Errorf("the %s healthcheck does not connect over TLS: %s", name, hc)
		}
	}
	conf, err := os.ReadFile("../../deploy/clickhouse/tls.xml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<tcp_port remove="1"/>`, `<http_port remove="1"/>`, "<tcp_port_secure>9440</tcp_port_secure>",
		"<certificateFile>/etc/clickhouse-server/tls/server.pem</certificateFile>", "<privateKeyFile>/etc/clickhouse-server/tls/server.key</privateKeyFile>",
		"<disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("deploy/clickhouse/tls.xml lacks %s", want)
		}
	}

	for _, name := range []string{"worker1", "worker2", "web", "talosctl"} {
		env := svc[name].Environment
		if env["TALOS_CLICKHOUSE_ADDR"] != strings.Join(addrs, ",") || env["TALOS_CLICKHOUSE_CA"] != "/chtls/nats-tls/ca.pem" || svc.mounts(name)["/chtls"] != "chtls" {
			t.Errorf("%s reaches ClickHouse at %q trusting %q (chtls mounted at /chtls: %v)", name,
				env["TALOS_CLICKHOUSE_ADDR"], env["TALOS_CLICKHOUSE_CA"], svc.mounts(name)["/chtls"] == "chtls")
		}
	}
	ds, err := os.ReadFile("../../deploy/grafana/provisioning/datasources/talos-clickhouse.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"port: 9440", "secure: true", "tlsAuthWithCACert: true", "tlsCACert: $__file{/chtls/nats-tls/ca.pem}"} {
		if !strings.Contains(string(ds), want) {
			t.Errorf("the Grafana data source lacks %s", want)
		}
	}
	if svc.mounts("grafana")["/chtls"] != "chtls" {
		t.Error("grafana does not mount the chtls volume its data source reads the CA from")
	}
}
