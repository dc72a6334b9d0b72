#!/usr/bin/env bash
# Quick start, command 2: run every test (this is exactly what CI runs).
# Installs ClickHouse, Chromium (for the dashboard test), bubblewrap (for
# the gateway's sandbox tests) and rsyslog with its OpenSSL driver (for the
# forward role's tests) and ZooKeeper (for the replicated ClickHouse
# tests) from the OS packages when missing, and Node.js plus
# the npm MCP servers the MCP tests run (testenv/mcp); NATS is embedded.
# Then two benchmark modes run at their smallest (below).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
ensure_clickhouse
ensure_zookeeper
ensure_chromium
ensure_bwrap
ensure_rsyslog
ensure_mcp_servers
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
echo "== go vet"
go vet ./...
# Dead code and suspicious constructs go vet does not see (staticcheck.conf
# says which checks are off and why); fetched through the Go module proxy.
echo "== staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
echo "== go test"
go test -count=1 -timeout 18m ./... "$@"
# The OPA comparison is its own module (the project never imports OPA); its
# test checks the Rego policy decides as the engine does.
echo "== go test (bench/opa)"
(cd bench/opa && go test -count=1 ./...)
# The benchmark harness, smallest sizes: its figures are not checked here
# (they need a quiet machine), but each mode fails on a stack that does
# not come up or evidence that does not add up, and a mode no one runs
# breaks unseen. The gateway mode does not wait for an idle machine here
# (another suite may run on a shared one): its figures are not the point.
echo "== benchmark harness: bash scripts/bench.sh verify 2000 ab HEAD 1; BENCH_NO_IDLE=1 bash scripts/bench.sh gateway 20 stdio"
bash scripts/bench.sh verify 2000 ab HEAD 1
BENCH_NO_IDLE=1 bash scripts/bench.sh gateway 20 stdio
