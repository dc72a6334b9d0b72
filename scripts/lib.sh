# Shared by scripts/dev.sh and scripts/test.sh. Sourced, not run.

# apt_install SERVICE PACKAGE...: installs Debian/Ubuntu packages (with sudo
# unless root). SERVICE, unless "-", is the system service a package may
# start, stopped at once: Talos's tests and dev stack run their own servers.
apt_install() {
  local service=$1 sudo=""
  shift
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
  if [ "$service" != - ] && command -v service >/dev/null 2>&1; then $sudo service "$service" stop >/dev/null 2>&1 || true; fi
}

# ensure_clickhouse installs Debian/Ubuntu's clickhouse-server and
# clickhouse-client when no clickhouse-server binary is on this machine.
ensure_clickhouse() {
  if command -v clickhouse-server >/dev/null 2>&1 || [ -x /usr/sbin/clickhouse-server ] || [ -x /usr/bin/clickhouse-server ]; then
    return 0
  fi
  echo "clickhouse-server not found: installing it from the OS packages (apt-get install clickhouse-server clickhouse-client)…" >&2
  # The package may start a system-wide server (it would hold port 9000).
  apt_install clickhouse-server clickhouse-server clickhouse-client
}

# ensure_chromium installs Debian/Ubuntu's chromium when /usr/bin/chromium
# is missing: the web dashboard's test drives it headless
# (cmd/talosd/web_test.go).
ensure_chromium() {
  if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  echo "chromium not found: installing it from the OS packages (apt-get install chromium) for the dashboard's headless-browser test…" >&2
  apt_install - chromium
}

# ensure_bwrap installs Debian/Ubuntu's bubblewrap when bwrap is missing:
# talos-mcp-gateway --sandbox runs stdio upstreams under it, and its tests
# (ingest/sandbox, cmd/talos-mcp-gateway/sandbox_test.go) need it.
ensure_bwrap() {
  if command -v bwrap >/dev/null 2>&1; then
    return 0
  fi
  echo "bwrap not found: installing it from the OS packages (apt-get install bubblewrap) for the gateway's sandbox tests…" >&2
  apt_install - bubblewrap
}

# ensure_rsyslog installs Debian/Ubuntu's rsyslog and its OpenSSL
# netstream driver when rsyslogd or the driver is missing: the forward
# role's tests (ingest/forward, cmd/talosd/forward_test.go) and
# `bash scripts/bench.sh forward` send to a private rsyslogd over TLS
# (testenv.StartRsyslog). The package's own system service is stopped: the
# tests run their own receivers.
ensure_rsyslog() {
  if { command -v rsyslogd >/dev/null 2>&1 || [ -x /usr/sbin/rsyslogd ]; } && ls /usr/lib/*/rsyslog/lmnsd_ossl.so >/dev/null 2>&1; then
    return 0
  fi
  echo "rsyslogd or its OpenSSL driver not found: installing them from the OS packages (apt-get install rsyslog rsyslog-openssl) for the forward role's tests…" >&2
  apt_install rsyslog rsyslog rsyslog-openssl
}

# ensure_bench_tools installs what scripts/bench.sh runs beside Talos when
# it is missing: /usr/bin/time (the verifier's peak RSS), procps (free,
# pgrep) and curl (the profiles, the log's and the collectors' HTTP ends).
# A minimal Debian/Ubuntu image has none of them.
ensure_bench_tools() {
  local missing=()
  [ -x /usr/bin/time ] || missing+=(time)
  { command -v free >/dev/null 2>&1 && command -v pgrep >/dev/null 2>&1; } || missing+=(procps)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "${missing[*]} not found: installing from the OS packages (apt-get install ${missing[*]}) for the benchmark harness…" >&2
  apt_install - "${missing[@]}"
}

# ensure_zookeeper installs Debian/Ubuntu's zookeeper (and a Java runtime
# with it) when its jar is missing: the replicated ClickHouse of the
# cluster tests (testenv.ClickHouseClusterForTest) coordinates through a
# private ZooKeeper run from /usr/share/java. The package's own system
# service, if it started one, is stopped: the tests run their own.
ensure_zookeeper() {
  if [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; then
    return 0
  fi
  echo "zookeeper not found: installing it from the OS packages (apt-get install zookeeper) for the replicated ClickHouse tests…" >&2
  apt_install zookeeper zookeeper
}

# ensure_node installs Debian/Ubuntu's nodejs and npm when node is missing:
# the MCP integration tests run npm MCP servers and the MCP Inspector CLI
# (testenv/mcp). They need Node.js 18 or newer (20 is what they are tested
# with).
ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "node/npm not found: installing them from the OS packages (apt-get install nodejs npm) for the MCP integration tests…" >&2
    apt_install - nodejs npm
  fi
  local major
  major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
  if [ "$major" -lt 18 ]; then
    echo "Node.js $(node --version 2>/dev/null) is too old for the MCP test servers: install Node.js 18 or newer." >&2
    exit 2
  fi
}

# ensure_mcp_servers installs the npm MCP servers and the MCP Inspector that
# the integration tests run (versions pinned by testenv/mcp/package-lock.json)
# into testenv/mcp/node_modules, when it is missing or older than the lock.
ensure_mcp_servers() {
  ensure_node
  local dir=testenv/mcp
  if [ -f "$dir/node_modules/.package-lock.json" ] && [ ! "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    return 0
  fi
  echo "installing the npm MCP servers for the tests (npm ci in $dir)…" >&2
  # engine-strict off: the Inspector asks for a newer Node than its CLI needs.
  (cd "$dir" && npm ci --no-audit --no-fund --engine-strict=false --loglevel=error)
}

ensure_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "Go is not installed: install Go 1.26 or newer (https://go.dev/doc/install) and run again." >&2
    exit 2
  fi
}
