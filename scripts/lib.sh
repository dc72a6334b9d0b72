# Shared by scripts/dev.sh and scripts/test.sh. Sourced, not run.

# ensure_clickhouse installs Debian/Ubuntu's clickhouse-server and
# clickhouse-client when no clickhouse-server binary is on this machine.
ensure_clickhouse() {
  if command -v clickhouse-server >/dev/null 2>&1 || [ -x /usr/sbin/clickhouse-server ] || [ -x /usr/bin/clickhouse-server ]; then
    return 0
  fi
  echo "clickhouse-server not found: installing it from the OS packages (apt-get install clickhouse-server clickhouse-client)…" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clickhouse-server clickhouse-client >/dev/null
  # The package may start a system-wide server; Talos runs its own private
  # one, so stop the system one if it is running (it would hold port 9000).
  if command -v service >/dev/null 2>&1; then $sudo service clickhouse-server stop >/dev/null 2>&1 || true; fi
}

# ensure_chromium installs Debian/Ubuntu's chromium when /usr/bin/chromium
# is missing: the web dashboard's test drives it headless
# (cmd/talosd/web_test.go).
ensure_chromium() {
  if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  echo "chromium not found: installing it from the OS packages (apt-get install chromium) for the dashboard's headless-browser test…" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
}

ensure_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "Go is not installed: install Go 1.26 or newer (https://go.dev/doc/install) and run again." >&2
    exit 2
  fi
}
