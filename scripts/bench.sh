#!/usr/bin/env bash
# Benchmark harness for BENCHMARKS.md. Starts, on this machine:
#   - `talosd dev --roles sink`: embedded NATS JetStream, a private ClickHouse
#     (installed from the OS packages if missing) and the ClickHouse sink;
#   - one enforce worker as its own process (`talosd --roles enforce`), so its
#     resident memory can be read alone;
# then runs `talosctl bench` twice (latency at an offered rate; throughput at
# saturation) and prints the worker's peak RSS. Arguments go to both benches.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
ensure_clickhouse
work=$(mktemp -d /tmp/talos-bench.XXXXXX)
mkdir -p "$work/bin"
go build -o "$work/bin/talosd" ./cmd/talosd
go build -o "$work/bin/talosctl" ./cmd/talosctl
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$work/bin/talosd" dev --no-demo --roles sink --data-dir "$work/dev" --clickhouse-port 0 \
  --nats-listen 127.0.0.1:14222 --http-addr "" >"$work/dev.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do grep -q "Talos dev stack is up" "$work/dev.log" && break; sleep 0.5; done
grep -q "Talos dev stack is up" "$work/dev.log" || { cat "$work/dev.log"; exit 1; }
ch=$(sed -n 's/^  ClickHouse:  \([^ ]*\).*/\1/p' "$work/dev.log")

"$work/bin/talosd" --roles enforce --nats-url nats://127.0.0.1:14222 --registry cmd/talosd/demo/registry \
  --signing-key "$work/dev/keys/signing.key" --instance bench-worker --http-addr "" >"$work/worker.log" 2>&1 &
worker=$!
pids+=($worker)
sleep 1

g=(--nats-url nats://127.0.0.1:14222 --clickhouse-addr "$ch")
echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(go version | cut -d' ' -f3), ClickHouse $(clickhouse-client --version 2>&1 | grep -o '[0-9][0-9.]*[0-9]' | head -1)"
echo "== latency: 100 enforcement points, 2,000 calls/s offered, 2 KB envelopes"
"$work/bin/talosctl" "${g[@]}" bench --calls 30000 --concurrency 100 --rate 2000 "$@"
echo "== throughput: 100 enforcement points, 4 calls in flight each, 2 KB envelopes"
"$work/bin/talosctl" "${g[@]}" bench --calls 40000 --concurrency 100 --rate 0 --inflight 4 "$@"
echo "== enforce worker peak RSS: $(awk '/VmHWM/{printf "%.0f MiB", $2/1024}' /proc/$worker/status)"
