#!/usr/bin/env bash
# Quick start, command 1: run the whole Talos pipeline locally with demo data.
# Embedded NATS JetStream, a private ClickHouse (installed from the OS packages
# if missing), a demo registry, generated keys and a burst of demo calls.
# Extra arguments go to `talosd dev` (see `go run ./cmd/talosd dev --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
ensure_clickhouse
exec go run ./cmd/talosd dev --data-dir "${TALOS_DATA_DIR:-./talos-data}" "$@"
