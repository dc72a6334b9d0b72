#!/usr/bin/env bash
# Benchmark harness for BENCHMARKS.md.
#
#   bash scripts/bench.sh         latency at 2,000 calls/s and throughput at
#                                 saturation, CPU per call of each process, the
#                                 enforce worker's peak RSS, and kill-switch
#                                 propagation (idle, and under the 2,000/s load)
#   bash scripts/bench.sh replay  latency at 2,000 calls/s and throughput, with no
#                                 control traffic alongside: the cost of the
#                                 replay claim (TALOS_REPLAY_STORAGE=memory to
#                                 compare the bucket in memory)
#   bash scripts/bench.sh flight  every call also sends its post event: two
#                                 receipts and one redacted ToolCallEvent per call
#   bash scripts/bench.sh verify [N]  talosctl verify over N (default 1,000,000)
#                                 signed, chained receipts with a checkpoint every
#                                 1,000, written by `talosctl synth`: receipts/s
#                                 and peak RSS of the verifier
#   bash scripts/bench.sh tail    the latency run in three arrangements: no sink,
#                                 sink at equal CPU priority, sink and ClickHouse
#                                 at nice 10 (where the p99 tail comes from)
#   bash scripts/bench.sh gateway [CALLS]  what talos-mcp-gateway adds per
#                                 tools/call: CALLS (default 2,000) calls of
#                                 mcp-server-everything's echo, directly and
#                                 through the gateway, interleaved, one in flight
#                                 (talosctl bench-mcp); waits until no `go test`
#                                 runs, so the machine is otherwise idle
#
# Every run has the checks talosd runs by default: capabilities (each call
# signed by the load generator and verified by the worker), preflight, the
# call ledger, redaction and a signed ToolCallEvent per completed call.
#
# Processes, all on this machine:
#   - `talosd dev`: embedded NATS JetStream and a private ClickHouse (installed
#     from the OS packages if missing), and, by default, the ClickHouse sink;
#   - one enforce worker as its own process (`talosd --roles enforce`), so its
#     CPU and memory can be read alone;
#   - `talosctl bench`, the load generator.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
ensure_clickhouse
mode=${1:-main}
work=$(mktemp -d /tmp/talos-bench.XXXXXX)
mkdir -p "$work/bin"
go build -o "$work/bin/talosd" ./cmd/talosd
go build -o "$work/bin/talosctl" ./cmd/talosctl
[ "$mode" != gateway ] || go build -o "$work/bin/talos-mcp-gateway" ./cmd/talos-mcp-gateway
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
nats=nats://127.0.0.1:14222
registry=cmd/talosd/demo/registry # the worker's (and the control role's) registry
eps=talosctl,demo-ep              # enforcement points with a NATS user
scope='tool:files:*'              # of the capability every call carries

# start ROLES [sink-nice]: the dev process with ROLES ("control" runs no
# pipeline role in this version), an optional separate sink, and a worker.
start() {
  local roles=$1 sink_nice=${2:-}
  rm -rf "$work/dev"
  "$work/bin/talosd" dev --no-demo --roles "$roles" --data-dir "$work/dev" --clickhouse-port 0 \
    --registry "$registry" --nats-eps "$eps" --nats-listen 127.0.0.1:14222 --http-addr "" >"$work/dev.log" 2>&1 &
  dev=$!; pids+=($dev)
  for _ in $(seq 1 120); do grep -q "Talos dev stack is up" "$work/dev.log" && break; sleep 0.5; done
  grep -q "Talos dev stack is up" "$work/dev.log" || { cat "$work/dev.log"; exit 1; }
  ch=$(sed -n 's/^  ClickHouse:  \([^ ]*\).*/\1/p' "$work/dev.log")
  chpid=$(pgrep -f "clickhouse-server.*$work" | head -1)
  if [ -n "$sink_nice" ]; then
    renice -n "$sink_nice" -p "$chpid" >/dev/null
    nice -n "$sink_nice" "$work/bin/talosd" --roles sink --nats-url $nats --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" --http-addr "" >"$work/sink.log" 2>&1 &
    pids+=($!)
  elif [ "$roles" = control ] && [ "${3:-}" = sink ]; then
    "$work/bin/talosd" --roles sink --nats-url $nats --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" --http-addr "" >"$work/sink.log" 2>&1 &
    pids+=($!)
  fi
  "$work/bin/talosd" --roles enforce --nats-url $nats --nats-auth "$work/dev/nats-auth.json" --registry "$registry" \
    --signing-key "$work/dev/keys/signing.key" --capability-issuers "$work/dev/keys/issuer.pub" \
    --instance bench-worker --http-addr "" >"$work/worker.log" 2>&1 &
  worker=$!; pids+=($worker)
  # Every call carries a capability issued by the dev issuer and is signed
  # by the demo agent (seed 002), as an enforcement point would send it.
  "$work/bin/talosctl" cap issue --issuer-key "$work/dev/keys/issuer.key" --subject demo-agent \
    --subject-key "$work/dev/keys/demo-agent.pub" --scope "$scope" --ttl 6h --out "$work/cap.json" >/dev/null
  sleep 1
}

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; } # user+system, in clock ticks (1/100 s)
bench() {
  "$work/bin/talosctl" --nats-url $nats --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" bench \
    --capability "$work/cap.json" --agent-key "$work/dev/keys/demo-agent.key" "$@"
}

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(go version | cut -d' ' -f3), ClickHouse $(clickhouse-client --version 2>&1 | grep -o '[0-9][0-9.]*[0-9]' | head -1)"
case $mode in
main)
  start sink,control
  ks=(--responder-key "$work/dev/keys/responder.key")
  echo "== kill switch propagation, idle stack: 100 set/clear rounds (200 commands), each waited for on every live worker"
  bench --calls 0 --killswitch 100 "${ks[@]}"
  echo "== latency: 100 enforcement points, 2,000 calls/s offered, 2 KB envelopes; kill switch rounds meanwhile"
  bench --calls 30000 --concurrency 100 --rate 2000 --killswitch 100 "${ks[@]}"
  echo "== throughput: 100 enforcement points, 4 calls in flight each, 2 KB envelopes"
  calls=40000
  d0=$(cpu $dev); w0=$(cpu $worker); c0=$(cpu $chpid)
  TIMEFORMAT='%U %S'
  { time bench --calls $calls --concurrency 100 --rate 0 --inflight 4 >"$work/tp.out"; } 2>"$work/tp.time"
  cat "$work/tp.out"
  d1=$(cpu $dev); w1=$(cpu $worker); c1=$(cpu $chpid)
  g=$(awk '{printf "%d", ($1+$2)*100}' "$work/tp.time")
  per() { awk -v t="$1" -v n=$calls 'BEGIN{printf "%.0f", t*10000/n}'; } # ticks → µs per call
  echo "== CPU per call during the throughput run: enforce worker $(per $((w1-w0))) µs, NATS + sink $(per $((d1-d0))) µs, ClickHouse $(per $((c1-c0))) µs, load generator $(per "$g") µs"
  echo "== enforce worker peak RSS: $(awk '/VmHWM/{printf "%.0f MiB", $2/1024}' /proc/$worker/status)"
  ;;
replay)
  start sink,control
  echo "== replay bucket storage: ${TALOS_REPLAY_STORAGE:-file}"
  echo "== latency: 100 enforcement points, 2,000 calls/s offered, 2 KB envelopes"
  bench --calls 20000 --concurrency 100 --rate 2000 | grep -E "p99|end to end"
  echo "== throughput: 100 enforcement points, 4 calls in flight each"
  bench --calls 30000 --concurrency 100 --rate 0 --inflight 4 | grep -E "decisions|end to end"
  ;;
flight)
  start sink,control
  echo "== flight recorder, latency: 100 enforcement points, 1,000 calls/s offered, each call a pre and a post envelope"
  echo "   (2 signed receipts + 1 redacted ToolCallEvent with its artifacts per call)"
  bench --calls 20000 --concurrency 100 --rate 1000 --post | grep -E "p99|end to end|post events"
  echo "== flight recorder, throughput: 100 enforcement points, 4 calls in flight each, pre + post"
  bench --calls 30000 --concurrency 100 --rate 0 --inflight 4 --post | grep -E "decisions|end to end|post events"
  ;;
tail)
  echo "== latency at 2,000 calls/s with no sink and no ClickHouse load"
  start control
  bench --no-clickhouse --calls 30000 --concurrency 100 --rate 2000 | grep p99
  stop_all
  echo "== the same with the sink as its own process, equal CPU priority"
  start control "" sink
  bench --calls 30000 --concurrency 100 --rate 2000 | grep -E "p99|end to end"
  stop_all
  echo "== the same with the sink and ClickHouse at nice 10"
  start control 10
  bench --calls 30000 --concurrency 100 --rate 2000 | grep -E "p99|end to end"
  ;;
verify)
  n=${2:-1000000}
  start control
  echo "== writing $n signed receipts in 4 chains, a checkpoint every 1,000 (talosctl synth)"
  "$work/bin/talosctl" --clickhouse-addr "$ch" --clickhouse-database synth synth --receipts "$n" --chains 4 \
    --checkpoint-every 1000 --key-out "$work/synth" 2>/dev/null
  echo "== talosctl verify over ClickHouse: every signature, link, Merkle root and stored column"
  if ! /usr/bin/time -f "%e s wall, %M KiB peak RSS, %P CPU" -o "$work/verify.time" \
    "$work/bin/talosctl" --clickhouse-addr "$ch" --clickhouse-database synth verify --trusted-keys "$work/synth.pub" \
    >"$work/verify.out" 2>"$work/verify.err"; then
    tail -20 "$work/verify.out"; tr '\r' '\n' <"$work/verify.err" | tail -5; exit 1
  fi
  tail -1 "$work/verify.out"
  cat "$work/verify.time"
  awk -v n="$n" '{printf "== verification: %.0f receipts/s, peak RSS %.0f MiB\n", n/$1, $4/1024}' "$work/verify.time"
  ;;
gateway)
  calls=${2:-2000} warmup=100
  everything=${MCP_SERVER_EVERYTHING:-$PWD/testenv/mcp/node_modules/.bin/mcp-server-everything}
  if [ ! -x "$everything" ]; then
    echo "mcp-server-everything not found at $everything: install the test MCP servers with" >&2
    echo "  npm ci --prefix testenv/mcp   (or set MCP_SERVER_EVERYTHING to the program)" >&2
    exit 2
  fi
  # Another benchmark or test suite on the same 2 cores would show up as
  # gateway latency: wait until no `go test` runs (up to 30 minutes).
  wait_idle() {
    local n=0
    while pgrep -f 'go test' >/dev/null; do
      [ $n -eq 0 ] && echo "== waiting for the running 'go test' to finish (the machine must be otherwise idle)"
      n=$((n + 1))
      [ $n -lt 360 ] || { echo "still busy after 30 minutes; giving up" >&2; exit 1; }
      sleep 5
    done
  }
  wait_idle
  registry=deploy/mcp/registry eps=talosctl,demo-ep,gw-bench scope='tool:everything:*'
  start sink,control
  gw="$work/bin/talos-mcp-gateway --ep-id gw-bench --registry $registry --nats-url $nats"
  gw+=" --nats-auth $work/dev/nats-auth.json --capability $work/cap.json --agent-key $work/dev/keys/demo-agent.key"
  gw+=" --session-id gw-bench --log-level warn --upstream 'everything=$everything'"
  echo "== node $(node --version), mcp-server-everything $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$(dirname "$everything")/../@modelcontextprotocol/server-everything/package.json" 2>/dev/null | head -1)"
  echo "== gateway added latency: $calls calls of everything/echo per side, directly and through talos-mcp-gateway, interleaved"
  echo "   the gateway signs each call with a capability chain; the worker runs every default check; the sink"
  echo "   projects receipts and ToolCallEvents into ClickHouse meanwhile (the full pipeline is busy, on the same cores)"
  wait_idle
  echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$work/bin/talosctl" bench-mcp --calls "$calls" --warmup "$warmup" --stderr "$work/servers.log" \
    --direct "everything=$everything" --via "gw=$gw" || { tail -20 "$work/servers.log"; exit 1; }
  if pgrep -f 'go test' >/dev/null; then
    echo "== a 'go test' started during the measurement: these figures are not of an idle machine; run again" >&2
    exit 1
  fi
  # Evidence that every call through the gateway went through Talos: the
  # gateway session's allowed pre decisions, post receipts and ToolCallEvents.
  want=$((calls + warmup))
  chq() { clickhouse-client --host "${ch%:*}" --port "${ch##*:}" -q "$1"; }
  for _ in $(seq 1 120); do
    got=$(chq "SELECT uniqExactIf(tool_call_id, phase = 'pre' AND decision = 'allow'), uniqExactIf(tool_call_id, phase = 'post') FROM talos.receipts WHERE session_id = 'gw-bench'" | tr '\t' ' ')
    events=$(chq "SELECT uniqExact(tool_call_id) FROM talos.tool_calls WHERE session_id = 'gw-bench'")
    [ "$got" = "$want $want" ] && [ "$events" = "$want" ] && break
    sleep 0.5
  done
  echo "== in ClickHouse for the gateway's session (warm-up included, $want calls): allowed pre decisions and post receipts: $got; ToolCallEvents: $events"
  [ "$got" = "$want $want" ] && [ "$events" = "$want" ] || { echo "some gateway calls left no receipt or ToolCallEvent" >&2; exit 1; }
  ;;
*)
  echo "usage: bash scripts/bench.sh [replay|flight|tail|verify [N]|gateway [CALLS]]" >&2
  exit 2
  ;;
esac
