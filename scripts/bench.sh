#!/usr/bin/env bash
# Benchmark harness for BENCHMARKS.md.
#
#   bash scripts/bench.sh         kill-switch propagation on an idle stack; latency
#                                 at 2,000 calls/s with kill-switch rounds
#                                 alongside (propagation under load) and the
#                                 enforce worker's peak RSS at that run;
#                                 throughput at saturation with the CPU per call
#                                 of each process; then p50/p90/p99 and
#                                 decisions/s at 500, 1,000, 2,000 and 4,000
#                                 calls/s and at 80 % of the saturation measured,
#                                 and whether p99 stays under 50 ms up to that 80 %
#   bash scripts/bench.sh replay  latency at 2,000 calls/s and throughput, with no
#                                 control traffic alongside
#                                 (TALOS_REPLAY_STORAGE=memory keeps the call
#                                 ledger's bucket in memory, to compare)
#   bash scripts/bench.sh flight  every call also sends its post event: two
#                                 receipts and one redacted ToolCallEvent per call
#   bash scripts/bench.sh ab [BASE] [ROUNDS]  the commit BASE (default ab02373)
#                                 against this working tree: both talosd and
#                                 talosctl built side by side, measured
#                                 alternately (base, new, new, base, base, …;
#                                 ROUNDS each, default 2), each on a fresh stack, each
#                                 side's talosctl its load generator (the wire
#                                 between an enforcement point and Talos may
#                                 differ between the two): throughput at
#                                 saturation with CPU per call of each process,
#                                 p50/p99 at 2,000 calls/s, end-to-end events/s,
#                                 the worker's peak RSS at 2,000 calls/s (and
#                                 its anonymous part after that run), flight
#                                 throughput, the NATS process's and ClickHouse's peak RSS,
#                                 each process's page faults per call at saturation;
#                                 prints base and new medians and
#                                 new/base ratios, then the ratio within each
#                                 round and its median (a round's two sides run
#                                 back to back, so a machine whose speed drifts
#                                 moves it less). BENCH_NEW_WORKER_FLAGS adds
#                                 flags to the new tree's worker only,
#                                 BENCH_NEW_DEV_FLAGS to its dev process (NATS +
#                                 sink) only: with --insecure-nats-plaintext,
#                                 what TLS costs; BENCH_AB_WARM=N first runs
#                                 N throughput runs of 40,000 calls on each
#                                 stack (a stack with a history). A base
#                                 talosctl that reports no CPU of its own
#                                 (ab02373) shows "-" for it and for the
#                                 other processes' cores. Before each
#                                 round's stack starts and after it stops,
#                                 the machine's speed: this tree's
#                                 BenchmarkSeal (receipts), the same code
#                                 every time (the slower of the two), so a
#                                 round whose figure is well above the
#                                 others' ran on a slower machine (a warning
#                                 says so); a slow stretch that began and
#                                 ended within a round goes unseen
#   bash scripts/bench.sh profile [SECONDS] [RATE] [post]  CPU profiles
#                                 (SECONDS, default 20) of the enforce worker
#                                 and the dev process (NATS + sink), both run
#                                 with --pprof, and of the load generator, during
#                                 a saturation load, or with RATE (0:
#                                 saturation) at that many calls/s offered (100
#                                 enforcement points); with post, every call
#                                 also sends its post event, as in flight; heap
#                                 profiles of both at its end; written
#                                 to a directory it prints, for go tool pprof
#   bash scripts/bench.sh verify [N]  talosctl verify over N (default 1,000,000)
#                                 signed, chained receipts with a checkpoint every
#                                 1,000, written by `talosctl synth`: receipts/s
#                                 and peak RSS of the verifier, signatures
#                                 checked one by one, then in batches
#                                 (--batch-signatures), then of the same
#                                 records exported (talosctl export --kind
#                                 all) and verified from the file (--file),
#                                 and from its lines shuffled (out of chain
#                                 order), and the inclusion proof of one receipt
#                                 from that file (--file --receipt);
#                                 `verify N profile`
#                                 also writes a CPU profile of each (talosctl
#                                 --cpuprofile) to a directory it prints;
#                                 `verify N ab BASE [ROUNDS]` runs BASE's
#                                 talosctl (built beside this tree's) and this
#                                 tree's on the same database, alternately,
#                                 ROUNDS (3) each, and prints the medians and
#                                 new/base
#   bash scripts/bench.sh killswitch [ROUNDS] [RATE]  what kill-switch rounds
#                                 alongside cost the latency at RATE calls/s
#                                 (default 2,000): ROUNDS (4) fresh stacks,
#                                 each running 30,000 calls with 100
#                                 set/clear rounds alongside and without, in
#                                 turn (odd rounds with them first, even
#                                 rounds without): p50/p90/p99, the rounds'
#                                 propagation p99, medians and the ratio
#                                 with/without within each round
#   bash scripts/bench.sh tail [RATE]  the latency run at RATE calls/s
#                                 (default 1,000: about half the saturation
#                                 here) for 15 s in three arrangements: no
#                                 sink, sink at equal CPU priority, sink and
#                                 ClickHouse at nice 10 (where the p99 tail
#                                 comes from)
#   bash scripts/bench.sh procs [ROUNDS]  one P per Go process (GOMAXPROCS=1
#                                 for the worker and the NATS process)
#                                 against Go's default (one per CPU),
#                                 alternately, ROUNDS each (default 2), a
#                                 fresh stack per arm:
#                                 at 500 and 2,000 calls/s and at
#                                 saturation, the latency and, per call,
#                                 each process's CPU and the worker's and
#                                 NATS process's context switches; medians
#                                 and ratios by rate
#   bash scripts/bench.sh tls [RATE] [ROUNDS]  what TLS on NATS costs at RATE
#                                 calls/s (default 500: calls mostly alone):
#                                 the same stack with TLS and with
#                                 --insecure-nats-plaintext, alternately,
#                                 ROUNDS each (default 2), 15 s of calls
#                                 per run: decision p50/p99, and per call
#                                 the CPU and the write and read system
#                                 calls (/proc/PID/io) of the NATS process
#                                 (with the sink) and of the worker, the
#                                 CPU of ClickHouse and of the load
#                                 generator, their sum, and the cores the
#                                 whole machine kept busy over the run
#   bash scripts/bench.sh sustained [RUNS] [LIMIT...]  RUNS (6) throughput
#                                 runs of 40,000 calls on one stack:
#                                 decisions/s, end-to-end events/s and CPU per
#                                 call as the history grows, with the NATS
#                                 process's RSS and its garbage collections
#                                 per run; with LIMITs, one stack per LIMIT in
#                                 turn, the NATS process's GOMEMLIMIT set to it
#                                 (talosd: its own choice), e.g. `sustained 14
#                                 1GiB talosd 1GiB talosd`
#   bash scripts/bench.sh gateway [CALLS]  what talos-mcp-gateway adds per
#                                 tools/call: CALLS (default 2,000) calls of
#                                 mcp-server-everything's echo, directly and
#                                 through the gateway, interleaved, one in flight
#                                 (talosctl bench-mcp), the gateway in three
#                                 arrangements: over stdio; over streamable
#                                 HTTP on loopback (--insecure-plain-http)
#                                 with a static token; over HTTPS with a JWT
#                                 (a CA, certificate, JWKS and token from
#                                 scripts/benchcreds), each HTTP gateway's own
#                                 mean time per stage from its /metrics
#                                 (decision, upstream, post); then the added
#                                 latency of the three side by side (`gateway
#                                 CALLS stdio`: the stdio tools/call one only).
#                                 Waits until no `go test` runs, so the
#                                 machine is otherwise idle; BENCH_NO_IDLE=1
#                                 skips that wait (the test command sets it:
#                                 it checks the mode runs, not its figures)
#   bash scripts/bench.sh forward [CALLS]  the forward role (SIEM forwarding):
#                                 TALOS_AUDIT filled by CALLS (default 20,000)
#                                 calls with their post events, then drained
#                                 by a talosd with only the forward role into
#                                 a private rsyslogd over TLS, then into an
#                                 HTTP event collector (scripts/benchsiem,
#                                 Splunk HEC's format): events/s and the
#                                 forwarder's CPU per event of each; then
#                                 decision p50/p99 at 400 calls/s (with post
#                                 events), two rounds of three runs in turn:
#                                 off; traced (every call names a sampled
#                                 parent span and the worker exports a
#                                 decision span per envelope to an
#                                 OpenTelemetry Collector); both (traced,
#                                 and forwarding to both destinations); the
#                                 spans the collector got and how far behind
#                                 the forwarder was at the end of each run
#   bash scripts/bench.sh log [CALLS] [ROUNDS] [RATE]  the transparency log (scripts/benchlog.sh):
#                                 two real witnesses (litewitness) cosigning
#                                 every checkpoint; TALOS_AUDIT filled by
#                                 CALLS (default 20,000) calls with their post
#                                 events, then drained by a talosd with only
#                                 the log role: appends/s and its CPU per
#                                 append; the delay from a record reaching
#                                 NATS to the first witnessed checkpoint
#                                 covering it at 400 calls/s (scripts/benchlog);
#                                 then decision p50/p99 at RATE calls/s (400)
#                                 with the log off and on, alternately, ROUNDS
#                                 rounds (2), a fresh stack each run
#   bash scripts/bench.sh cluster [ROUNDS]  replication (scripts/benchcluster.sh):
#                                 R1 against R3 streams and buckets on a
#                                 three-node NATS cluster (scripts/benchcluster),
#                                 a fresh stack per run, alternately: decision
#                                 p50/p99 at 500 and 1,000 calls/s, decisions/s
#                                 and end-to-end events/s at saturation, and
#                                 each process's CPU per call
#
# Every run has the checks talosd runs by default: capabilities (each call
# signed by the load generator and verified by the worker), preflight, the
# call ledger, redaction and a signed ToolCallEvent per completed call.
#
# Processes, all on this machine:
#   - `talosd dev`: embedded NATS JetStream and a private ClickHouse (installed
#     from the OS packages if missing), and, by default, the ClickHouse sink.
#     NATS requires TLS (the CA talosd dev generates in its data dir, which
#     every other process finds beside nats-auth.json), so every figure
#     includes it; `ab` against a commit from before NATS TLS compares a
#     plaintext base with a TLS new tree;
#   - one enforce worker as its own process (`talosd --roles enforce`), so its
#     CPU and memory can be read alone;
#   - `talosctl bench`, the load generator. It builds and signs every envelope
#     before the clock starts and reports its own CPU over the timed part, so
#     the CPU per call of the other processes is read from /proc around each
#     run and the load generator's from its own report.
#
# BENCH_WORKER_FLAGS adds flags to the worker in every mode but ab and
# procs (e.g. "--chains 64"), BENCH_GATEWAY_FLAGS to every gateway of the
# gateway mode.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
mode=${1:-main}
case $mode in
main | replay | flight | killswitch | tail | tls | procs | sustained | verify | gateway | ab | profile | forward | log | cluster) ;;
*)
  echo "usage: bash scripts/bench.sh [replay|flight|killswitch [ROUNDS] [RATE]|tail [RATE]|tls [RATE] [ROUNDS]|procs [ROUNDS]|sustained [RUNS] [LIMIT...]|ab [BASE] [ROUNDS]|profile [SECONDS] [RATE]|verify [N] [profile|ab BASE [ROUNDS]]|gateway [CALLS] [stdio]|forward [CALLS]|log [CALLS] [ROUNDS] [RATE]|cluster [ROUNDS]]" >&2
  exit 2
  ;;
esac
ensure_go
ensure_clickhouse
ensure_bench_tools
[ "$mode" != forward ] || ensure_rsyslog
work=$(mktemp -d /tmp/talos-bench.XXXXXX)
mkdir -p "$work/bin"
pids=()      # stopped with SIGINT (talosd and talosctl drain on it)
term_pids=() # stopped with SIGTERM: a background job of a script ignores SIGINT, which rsyslogd and benchsiem keep
stop_all() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${term_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}" "${term_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=() term_pids=()
  # The dev process stops its ClickHouse; the next stack starts only once it is gone.
  for _ in $(seq 1 60); do pgrep -f "clickhouse-server.*$work" >/dev/null || break; sleep 0.5; done
}
trap 'stop_all; rm -rf "$work"' EXIT
go build -o "$work/bin/talosd" ./cmd/talosd
go build -o "$work/bin/talosctl" ./cmd/talosctl
go build -o "$work/bin/machinecost" ./scripts/machinecost
if [ "$mode" = gateway ]; then
  go build -o "$work/bin/talos-mcp-gateway" ./cmd/talos-mcp-gateway
fi
if [ "$mode" = gateway ] || [ "$mode" = forward ]; then
  go build -o "$work/bin/benchcreds" ./scripts/benchcreds
fi
if [ "$mode" = cluster ]; then
  go build -o "$work/bin/benchcluster" ./scripts/benchcluster
fi
if [ "$mode" = log ]; then
  go build -o "$work/bin/benchlog" ./scripts/benchlog
  echo "== building litewitness and its harness (testenv/witness)"
  go build -C testenv/witness -o "$work/bin/witness" .
  go build -C testenv/witness -o "$work/bin/litewitness" filippo.io/torchwood/cmd/litewitness
fi
if [ "$mode" = forward ]; then
  go build -o "$work/bin/benchsiem" ./scripts/benchsiem
  echo "== building the OpenTelemetry Collector (OTLP in, a file out) that receives the worker's spans"
  go build -C testenv/otelcol -o "$work/bin/otelcol" .
fi

talosd=$work/bin/talosd           # the talosd that start runs (ab switches it)
talosctl=$work/bin/talosctl       # the talosctl that start and bench run (ab switches it)
registry=cmd/talosd/demo/registry # the worker's (and the control role's) registry
eps=talosctl,demo-ep              # enforcement points with a NATS user
scope='tool:files:*'              # of the capability every call carries
worker_flags=(${BENCH_WORKER_FLAGS:-}) # extra flags for the worker
worker_env=()                     # extra environment variables for the worker (VAR=value)
dev_flags=()                      # extra flags for the dev process
dev_env=()                        # extra environment variables for the dev process (VAR=value)
pprof=()                          # profile: --pprof on the worker and the dev process

# start ROLES [sink-nice] [sink]: the dev process with ROLES ("control" runs
# no pipeline role in this version), an optional separate sink, and a worker.
start() {
  local roles=$1 sink_nice=${2:-}
  local http=(--http-addr "")
  [ ${#pprof[@]} -eq 0 ] || http=(--http-addr 127.0.0.1:0 "${pprof[@]}")
  rm -rf "$work/dev"
  env ${dev_env[@]+"${dev_env[@]}"} "$talosd" dev --no-demo --roles "$roles" --data-dir "$work/dev" --clickhouse-port 0 \
    --registry "$registry" --nats-eps "$eps" --nats-listen 127.0.0.1:14222 "${http[@]}" ${dev_flags[@]+"${dev_flags[@]}"} >"$work/dev.log" 2>&1 &
  dev=$!; pids+=($dev)
  for _ in $(seq 1 120); do grep -q "Talos dev stack is up" "$work/dev.log" && break; sleep 0.5; done
  grep -q "Talos dev stack is up" "$work/dev.log" || { cat "$work/dev.log"; exit 1; }
  nats=$(sed -n 's/^  NATS:        \([^ ]*\).*/\1/p' "$work/dev.log") # another port if 14222 was busy
  ch=$(sed -n 's/^  ClickHouse:  \([^ ]*\).*/\1/p' "$work/dev.log")
  chpid=$(pgrep -f "clickhouse-server.*$work" | head -1)
  if [ -n "$sink_nice" ]; then
    renice -n "$sink_nice" -p "$chpid" >/dev/null
    nice -n "$sink_nice" "$talosd" --roles sink --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" --http-addr "" >"$work/sink.log" 2>&1 &
    pids+=($!)
  elif [ "$roles" = control ] && [ "${3:-}" = sink ]; then
    "$talosd" --roles sink --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" --http-addr "" >"$work/sink.log" 2>&1 &
    pids+=($!)
  fi
  env ${worker_env[@]+"${worker_env[@]}"} "$talosd" --roles enforce --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --registry "$registry" \
    --signing-key "$work/dev/keys/signing.key" --capability-issuers "$work/dev/keys/issuer.pub" \
    --instance bench-worker "${http[@]}" ${worker_flags[@]+"${worker_flags[@]}"} >"$work/worker.log" 2>&1 &
  worker=$!; pids+=($worker)
  # Every call carries a capability issued by the dev issuer and is signed
  # by the demo agent, as an enforcement point would send it.
  "$talosctl" cap issue --issuer-key "$work/dev/keys/issuer.key" --subject demo-agent \
    --subject-key "$work/dev/keys/demo-agent.pub" --scope "$scope" --ttl 6h --out "$work/cap.json" >/dev/null
  sleep 1
  kill -0 "$worker" 2>/dev/null || { echo "the enforce worker did not start:" >&2; cat "$work/worker.log" >&2; exit 1; }
}

port_from() { # port_from FIRST: a loopback port from FIRST on that nothing listens on
  local p
  for p in $(seq "$1" $(($1 + 49))); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }; done
  echo "no free port in $1-$(($1 + 49))" >&2; exit 1
}
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; } # user+system, in clock ticks (1/100 s)
busy() { awk '/^cpu /{print $2+$3+$4}' /proc/stat; } # the whole machine's user+nice+system, likewise
flt() { awk '{print $10}' "/proc/$1/stat"; } # minor page faults so far
rss() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; } # peak RSS so far, MiB
# rss_anon PID: resident anonymous memory now, MiB (the heap, stacks and
# the runtime's own). The rest of a talosd's RSS is file pages: the
# binary's code and data it touched, which the other talosd processes
# of the machine share and the kernel may drop and read again.
rss_anon() { awk '/RssAnon/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
rss_file() { awk '/RssFile/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
# csw PID: context switches of the process's threads so far (voluntary and
# not; threads that exited are not counted). Read through cat: mawk gives
# up on a file that vanishes, a thread that exits meanwhile.
csw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/{n+=$2} END{print n+0}'; }
# sysc PID: write and read system calls the process made so far.
sysc() { awk '/^syscw/{w=$2} /^syscr/{r=$2} END{print w, r}' "/proc/$1/io"; }
bench() {
  local args=() json=
  while [ $# -gt 0 ]; do # a talosctl from before --json-out (an ab base) prints its JSON with --json
    if [ "$1" = --json-out ] && [ -n "${legacy_bench:-}" ]; then json=$2; shift 2; continue; fi
    args+=("$1"); shift
  done
  if [ -n "$json" ]; then
    bench_cmd ${args[@]+"${args[@]}"} --json >"$json"
  else
    bench_cmd ${args[@]+"${args[@]}"}
  fi
}
bench_cmd() {
  "$talosctl" --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --clickhouse-addr "$ch" bench \
    --capability "$work/cap.json" --agent-key "$work/dev/keys/demo-agent.key" "$@"
}
# jf FILE KEY: a number from talosctl bench's --json-out (a flat JSON object).
jf() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
# median FILE COLUMN: the median of a column of FILE's rows after its
# header line ("-" rows left out; the mean of the middle two for an even
# count).
median() { awk -v c="$2" 'NR>1 && $c != "-" {print $c}' "$1" | sort -g | awk '{v[NR]=$1} END{if (NR == 0) printf "-"; else printf "%.6g", NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
# per TICKS CALLS: clock ticks → µs per call.
per() { awk -v t="$1" -v n="$2" 'BEGIN{printf "%.0f", t*10000/n}'; }
# per_call COUNT CALLS: a count per call, two decimals.
per_call() { awk -v c="$1" -v n="$2" 'BEGIN{printf "%.2f", c/n}'; }

# saturate NAME CALLS [bench flags…]: 100 enforcement points, 4 calls in
# flight each, as fast as decisions come back; the JSON result goes to
# $work/NAME.json and the human output to $work/NAME.out. Sets the CPU per
# call of each process over the run: cpu_worker, cpu_dev (NATS + sink),
# cpu_ch (ClickHouse), cpu_gen (the load generator's own report, timed part)
# and cpu_stack (worker + NATS + sink + ClickHouse); flt_worker, flt_dev and
# flt_ch, each process's minor page faults per call; and other_cores, the
# CPU the rest of the machine used meanwhile (cores; what none of these
# processes used), which says whether the figures are of a quiet machine.
saturate() {
  local name=$1 calls=$2 d0 w0 c0 d1 w1 c1 m0 m1 t0 t1 n gen fd0 fw0 fc0 fd1 fw1 fc1
  shift 2
  m0=$(busy); t0=$(date +%s%N)
  d0=$(cpu $dev); w0=$(cpu $worker); c0=$(cpu $chpid)
  fd0=$(flt $dev); fw0=$(flt $worker); fc0=$(flt $chpid)
  bench --calls "$calls" --concurrency 100 --rate 0 --inflight 4 --json-out "$work/$name.json" "$@" >"$work/$name.out"
  d1=$(cpu $dev); w1=$(cpu $worker); c1=$(cpu $chpid)
  fd1=$(flt $dev); fw1=$(flt $worker); fc1=$(flt $chpid)
  m1=$(busy); t1=$(date +%s%N)
  n=$(jf "$work/$name.json" calls)
  cpu_worker=$(per $((w1 - w0)) "$n") cpu_dev=$(per $((d1 - d0)) "$n") cpu_ch=$(per $((c1 - c0)) "$n")
  cpu_gen=$(awk -v x="$(jf "$work/$name.json" loadgen_cpu_us_per_call)" 'BEGIN{printf "%.0f", x}')
  cpu_stack=$((cpu_worker + cpu_dev + cpu_ch))
  flt_dev=$(per_call $((fd1 - fd0)) "$n") flt_worker=$(per_call $((fw1 - fw0)) "$n") flt_ch=$(per_call $((fc1 - fc0)) "$n")
  gen=$(awk -v a="$(jf "$work/$name.json" prepare_cpu_seconds)" -v b="$(jf "$work/$name.json" loadgen_cpu_seconds)" 'BEGIN{printf "%.0f", (a+b)*100}')
  other_cores=$(awk -v m=$((m1 - m0)) -v ours=$((w1 - w0 + d1 - d0 + c1 - c0 + gen)) -v ns=$((t1 - t0)) \
    'BEGIN{o = (m - ours) / 100 / (ns / 1e9); printf "%.2f", (o > 0 ? o : 0)}')
  # A talosctl that reports no CPU of its own (an old ab base): what it used
  # is not told apart from other processes'.
  [ -z "${legacy_bench:-}" ] || other_cores=- cpu_gen=-
}

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(go version | cut -d' ' -f3), ClickHouse $(clickhouse-client --version 2>&1 | grep -o '[0-9][0-9.]*[0-9]' | head -1)"
# What a hop through NATS costs besides arithmetic (go run ./scripts/machinecost):
# a virtual machine may charge many times bare metal's for each.
echo "== machine: $("$work/bin/machinecost")"
case $mode in
main)
  start sink,control
  ks=(--responder-key "$work/dev/keys/responder.key")
  echo "== kill switch propagation, idle stack: 100 set/clear rounds (200 commands), each waited for on every live worker"
  bench --calls 0 --killswitch 100 "${ks[@]}"
  echo "== latency: 100 enforcement points, 2,000 calls/s offered, 2 KB envelopes; kill switch rounds meanwhile"
  d0=$(cpu $dev) w0=$(cpu $worker) c0=$(cpu $chpid)
  bench --calls 30000 --concurrency 100 --rate 2000 --killswitch 100 "${ks[@]}" --json-out "$work/lat.json"
  d1=$(cpu $dev) w1=$(cpu $worker) c1=$(cpu $chpid)
  echo "== CPU per call during the 2,000 calls/s run (kill-switch rounds included): enforce worker $(per $((w1 - w0)) 30000) µs, NATS + sink $(per $((d1 - d0)) 30000) µs, ClickHouse $(per $((c1 - c0)) 30000) µs, load generator $(jf "$work/lat.json" loadgen_cpu_us_per_call | awk '{printf "%.0f", $1}') µs (its own report)"
  echo "== enforce worker peak RSS at the 2,000 calls/s run: $(rss $worker) MiB (resident now: $(rss_anon $worker) MiB anonymous, $(rss_file $worker) MiB file pages, mostly talosd's code)"
  echo "== throughput: 100 enforcement points, 4 calls in flight each, 2 KB envelopes"
  saturate tp 40000
  cat "$work/tp.out"
  echo "== CPU per call during the throughput run: enforce worker $cpu_worker µs, NATS + sink $cpu_dev µs, ClickHouse $cpu_ch µs, load generator $cpu_gen µs (its own report, timed part); stack (worker + NATS + sink + ClickHouse) $cpu_stack µs"
  echo "== page faults per call during the throughput run: enforce worker $flt_worker, NATS + sink $flt_dev, ClickHouse $flt_ch"
  echo "== other processes on this machine used $other_cores cores meanwhile (near 0 on a quiet machine)"
  sat=$(awk -v x="$(jf "$work/tp.json" decisions_per_sec)" 'BEGIN{printf "%.0f", x}')
  at80=$(awk -v s="$sat" 'BEGIN{printf "%.0f", int(s*0.8/10+0.5)*10}')
  echo "== saturation (throughput run): $sat decisions/s; 80 % of it: $at80 calls/s"
  echo "== latency by offered rate: 100 enforcement points, 2 KB envelopes, no control traffic; 10 s of calls per rate"
  echo "   (at least 6,000; above saturation, 10 s of what the stack decides: there the queue, and p99, only grow with the run)"
  rates=$(printf '%s\n' 500 1000 2000 4000 "$at80" | sort -n | uniq)
  echo "   (stack µs: the CPU of worker + NATS + sink + ClickHouse over the run, until its last record is in ClickHouse, per call;"
  echo "   load gen µs: its own report; cores: (stack µs + load gen µs) x decisions/s, of $(nproc): what those processes used"
  echo "   over the run, background work included, such as ClickHouse merging the earlier runs' rows, which weighs most at low rates)"
  printf '   %-26s %12s %9s %9s %9s %9s %12s %6s   %s\n' "offered calls/s" "decisions/s" "p50 ms" "p90 ms" "p99 ms" \
    "stack µs" "load gen µs" "cores" "p99 < 50 ms?"
  verdict=yes
  for r in $rates; do
    [ "$r" -gt 0 ] || continue
    calls=$(((r < sat ? r : sat) * 10))
    calls=$((calls > 6000 ? calls : 6000))
    d0=$(cpu $dev) w0=$(cpu $worker) c0=$(cpu $chpid)
    # A generous decision timeout: beyond saturation the queue shows as latency, not as missing decisions.
    bench --calls "$calls" --concurrency 100 --rate "$r" --timeout 60s --json >"$work/rate.json"
    d1=$(cpu $dev) w1=$(cpu $worker) c1=$(cpu $chpid)
    stack_us=$(per $((w1 - w0 + d1 - d0 + c1 - c0)) "$calls")
    gen_us=$(jf "$work/rate.json" loadgen_cpu_us_per_call)
    cores=$(awk -v s="$stack_us" -v g="$gen_us" -v r="$(jf "$work/rate.json" decisions_per_sec)" 'BEGIN{printf "%.2f", (s + g) * r / 1e6}')
    label=$r
    [ "$r" != "$at80" ] || label="$r (80 % of saturation)"
    if [ "$r" -le "$at80" ]; then
      ok=$(awk -v p="$(jf "$work/rate.json" decision_p99_ms)" 'BEGIN{print (p < 50) ? "yes" : "NO"}')
      [ "$ok" = yes ] || verdict=no
    else
      ok="(above 80 % of saturation)"
    fi
    lost=$(jf "$work/rate.json" no_decision)
    [ "$lost" = 0 ] || ok+=" ($lost calls without a decision in 60 s)"
    printf '   %-26s %12.0f %9.2f %9.2f %9.2f %9s %12.0f %6s   %s\n' "$label" "$(jf "$work/rate.json" decisions_per_sec)" \
      "$(jf "$work/rate.json" decision_p50_ms)" "$(jf "$work/rate.json" decision_p90_ms)" "$(jf "$work/rate.json" decision_p99_ms)" \
      "$stack_us" "$gen_us" "$cores" "$ok"
  done
  echo "== p99 under 50 ms at every rate up to 80 % of saturation ($at80 calls/s): $verdict"
  echo "== enforce worker peak RSS over the whole run: $(rss $worker) MiB"
  ;;
replay)
  start sink,control
  echo "== call ledger bucket storage: ${TALOS_REPLAY_STORAGE:-file}"
  echo "== latency: 100 enforcement points, 2,000 calls/s offered, 2 KB envelopes"
  bench --calls 20000 --concurrency 100 --rate 2000 | grep -E "p99|end to end"
  echo "== throughput: 100 enforcement points, 4 calls in flight each"
  bench --calls 30000 --concurrency 100 --rate 0 --inflight 4 | grep -E "decisions|end to end|load generator \(this"
  ;;
flight)
  start sink,control
  echo "== flight recorder, latency: 100 enforcement points, 1,000 calls/s offered, each call a pre and a post envelope"
  echo "   (2 signed receipts + 1 redacted ToolCallEvent with its artifacts per call)"
  bench --calls 20000 --concurrency 100 --rate 1000 --post | grep -E "p99|end to end|post events"
  echo "== flight recorder, throughput: 100 enforcement points, 4 calls in flight each, pre + post"
  bench --calls 30000 --concurrency 100 --rate 0 --inflight 4 --post | grep -E "decisions|end to end|post events|load generator \(this"
  ;;
ab)
  base=${2:-ab02373} rounds=${3:-2}
  base_rev=$(git rev-parse --verify --quiet "$base^{commit}") || { echo "no such commit: $base" >&2; exit 2; }
  new_rev="$(git rev-parse --short HEAD)"
  [ -z "$(git status --porcelain)" ] || new_rev+=" + uncommitted changes"
  # The base tree, exported (no checkout in this one), built beside this one.
  mkdir -p "$work/base/src" "$work/base/bin"
  git archive "$base_rev" | tar -x -C "$work/base/src"
  (cd "$work/base/src" && go build -o "$work/base/bin/talosd" ./cmd/talosd && go build -o "$work/base/bin/talosctl" ./cmd/talosctl)
  # The machine's speed before and after each round's stack: one fixed
  # workload (sealing a receipt: canonical JSON, SHA-256, Ed25519), this
  # tree's code for both sides, while no stack runs.
  go test -c -o "$work/bin/speed.test" ./receipts
  machine_speed() {
    "$work/bin/speed.test" -test.run '^$' -test.bench '^BenchmarkSeal$' -test.benchtime 20000x -test.count 1 |
      awk '$1 ~ /^BenchmarkSeal/ {printf "%.1f", $3 / 1000}'
  }
  read -r -a new_flags <<<"${BENCH_NEW_WORKER_FLAGS:-}"
  read -r -a new_dev_flags <<<"${BENCH_NEW_DEV_FLAGS:-}"
  warm=${BENCH_AB_WARM:-0}
  echo "== A/B: base $(git rev-parse --short "$base_rev") ($(git log -1 --format=%s "$base_rev" | cut -c1-60)) against new $new_rev"
  echo "   $rounds round(s), alternating base and new (base first in odd rounds, new first in even ones), each on a fresh stack; load generator: each side's own talosctl"
  [ ${#new_flags[@]} -eq 0 ] || echo "   the new worker also gets: ${new_flags[*]}"
  [ ${#new_dev_flags[@]} -eq 0 ] || echo "   the new dev process also gets: ${new_dev_flags[*]}"
  [ "$warm" -eq 0 ] || echo "   each stack first runs $warm throughput runs of 40,000 calls (BENCH_AB_WARM): the figures are of a stack that has handled $((warm * 40000)) calls"
  cols="tp_decisions_s e2e_events_s p50_ms p99_ms worker_rss_mib cpu_worker cpu_nats_sink cpu_clickhouse cpu_loadgen cpu_stack flight_calls_s flight_events_s worker_anon_mib nats_rss_mib ch_rss_mib flt_nats_sink flt_worker flt_clickhouse seal_us other_cores"
  for side in base new; do echo "$cols" >"$work/ab.$side.tsv"; done
  fmt='function f(x) { return x == "-" ? x : (x >= 100 || x <= -100) ? sprintf("%.0f", x) : sprintf("%.2f", x) } ' # awk: a figure, readably
  # side SIDE ROUND: one fresh stack of SIDE's talosd and its measurements,
  # one row of $work/ab.SIDE.tsv.
  side() {
    local s=$1 i=$2 tp lat fl rss_mib anon_mib nats_rss ch_rss speed
    if [ "$s" = base ]; then
      talosd=$work/base/bin/talosd talosctl=$work/base/bin/talosctl registry=$work/base/src/cmd/talosd/demo/registry worker_flags=() dev_flags=()
    else
      talosd=$work/bin/talosd talosctl=$work/bin/talosctl registry=cmd/talosd/demo/registry worker_flags=(${new_flags[@]+"${new_flags[@]}"})
      dev_flags=(${new_dev_flags[@]+"${new_dev_flags[@]}"})
    fi
    legacy_bench=
    "$talosctl" bench --help 2>&1 | grep -q -- --json-out || legacy_bench=1
    speed=$(machine_speed)
    echo "== round $i, $s (load average $(cut -d' ' -f1-3 /proc/loadavg); BenchmarkSeal $speed µs)"
    start sink,control
    for _ in $(seq 1 "$warm"); do saturate warm 40000; done
    bench --calls 20000 --concurrency 100 --rate 2000 --json-out "$work/lat.json" >/dev/null
    rss_mib=$(rss $worker) anon_mib=$(rss_anon $worker)
    saturate tp 40000
    bench --calls 20000 --concurrency 100 --rate 0 --inflight 4 --post --json-out "$work/fl.json" >/dev/null
    nats_rss=$(rss $dev) ch_rss=$(rss $chpid)
    stop_all
    # Again once the stack has stopped: the slower of the two stands.
    speed=$(awk -v a="$speed" -v b="$(machine_speed)" 'BEGIN{print (b > a ? b : a)}')
    lat=$work/lat.json tp=$work/tp.json fl=$work/fl.json
    echo "$(jf $tp decisions_per_sec) $(jf $tp e2e_events_per_sec) $(jf $lat decision_p50_ms) $(jf $lat decision_p99_ms) $rss_mib" \
      "$cpu_worker $cpu_dev $cpu_ch $cpu_gen $cpu_stack $(jf $fl decisions_per_sec) $(jf $fl e2e_events_per_sec) $anon_mib $nats_rss $ch_rss $flt_dev $flt_worker $flt_ch $speed $other_cores" >>"$work/ab.$s.tsv"
    awk -v s="$s" "$fmt"'NR==1{for(i=1;i<=NF;i++)h[i]=$i} END{printf "   %s:", s; for(i=1;i<=NF;i++) printf " %s %s", h[i], f($i); print ""}' "$work/ab.$s.tsv"
  }
  # ABBA: base first in odd rounds, new first in even ones, so that a
  # machine slowing down under sustained load (BenchmarkSeal after a
  # stack runs slower than before it, here) does not always fall on the
  # side that runs second.
  for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) -eq 1 ]; then
      side base "$i"
      side new "$i"
    else
      side new "$i"
      side base "$i"
    fi
  done
  echo "== A/B medians of $rounds round(s): base $(git rev-parse --short "$base_rev"), new $new_rev"
  printf '   %-58s %10s %10s %9s\n' figure base new new/base
  i=0
  for label in "decisions/s at saturation (4 in flight per point)" "end-to-end events/s (throughput run)" \
    "decision p50 at 2,000 calls/s (ms)" "decision p99 at 2,000 calls/s (ms)" "worker peak RSS at 2,000 calls/s (MiB)" \
    "CPU per call, enforce worker (µs)" "CPU per call, NATS + sink (µs)" "CPU per call, ClickHouse (µs)" \
    "CPU per call, load generator (µs, its own report)" "CPU per call, stack: worker + NATS + sink + ClickHouse (µs)" \
    "flight: calls/s at saturation (pre + post)" "flight: end-to-end events/s" \
    "worker anonymous RSS after the 2,000 calls/s run (MiB)" "NATS process peak RSS, all runs (MiB)" \
    "ClickHouse peak RSS, all runs (MiB)" \
    "page faults per call, NATS + sink (throughput run)" "page faults per call, enforce worker" "page faults per call, ClickHouse" \
    "machine: BenchmarkSeal around the round (µs; same code)"; do
    i=$((i + 1))
    b=$(median "$work/ab.base.tsv" $i) n=$(median "$work/ab.new.tsv" $i)
    awk -v l="$label" -v b="$b" -v n="$n" "$fmt"'BEGIN{printf "   %-58s %10s %10s %9s\n", l, f(b), f(n), (b > 0 ? sprintf("%.2f", n/b) : "-")}'
  done
  b=$(median "$work/ab.base.tsv" 10) n=$(median "$work/ab.new.tsv" 10)
  echo "== stack CPU per call (worker + NATS + sink + ClickHouse): base $b µs, new $n µs; base/new $(awk -v b="$b" -v n="$n" 'BEGIN{if (n > 0) printf "%.2f", b/n; else print "-"}') (the target: at least 3)"
  # The two sides of a round run minutes apart, the rounds further apart:
  # on a machine whose speed drifts, the ratio within each round moves
  # less than the ratio of the two sides' medians.
  echo "== new/base within each round (the two sides ran back to back), and their median:"
  paste "$work/ab.base.tsv" "$work/ab.new.tsv" | awk -v n=$(($(head -1 "$work/ab.base.tsv" | wc -w))) '
    function r(c) { return ($c == "-" || $(c + n) == "-" || $c == 0) ? "-" : $(c + n) / $c }
    function med(a, k,   i, j, t) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return k == 0 ? "-" : sprintf("%.2f", k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2)
    }
    NR == 1 { next }
    { k++; line = sprintf("   round %d:", k)
      split("1 3 4 10 11", cs, " ")
      for (x = 1; x <= 5; x++) { v = r(cs[x]); line = line sprintf(" %s %s", name[x], v == "-" ? v : sprintf("%.2f", v)); if (v != "-") vals[x, ++cnt[x]] = v }
      print line }
    BEGIN { split("saturation p50 p99 stack_cpu flight", name, " ") }
    END { line = "   median: "
      for (x = 1; x <= 5; x++) { delete a; for (i = 1; i <= cnt[x]; i++) a[i] = vals[x, i]; line = line sprintf(" %s %s", name[x], med(a, cnt[x])) }
      print line }'
  echo "== every run, in order of the figures above; last, the cores other processes used during its throughput run:"
  for s in base new; do
    awk -v s="$s" "$fmt"'NR>1{printf "   %-4s", s; for(i=1;i<=NF;i++) printf " %9s", f($i); print ""}' "$work/ab.$s.tsv"
  done
  busiest=$(awk 'FNR>1 && $NF != "-" && $NF+0 > m+0 {m = $NF} END{printf "%.2f", m}' "$work/ab.base.tsv" "$work/ab.new.tsv")
  if awk -v m="$busiest" 'BEGIN{exit !(m > 0.2)}'; then
    echo "== other processes used up to $busiest cores during a throughput run: the machine was not quiet, so these ratios are noise as much as code; run again when it is" >&2
  fi
  # The machine's speed: the slowest round's BenchmarkSeal against the
  # fastest's (the same code in every round).
  spread=$(awk 'FNR==1 {for (i = 1; i <= NF; i++) if ($i == "seal_us") c = i; next} $c != "-" {if (lo == "" || $c < lo) lo = $c; if ($c > hi) hi = $c} END{if (lo > 0) printf "%.2f", hi / lo; else print 1}' "$work/ab.base.tsv" "$work/ab.new.tsv")
  if awk -v r="$spread" 'BEGIN{exit !(r > 1.15)}'; then
    echo "== the machine's speed moved between rounds (BenchmarkSeal: the slowest round $spread times the fastest's): compare rounds of similar speed, or run again" >&2
  fi
  ;;
profile)
  secs=${2:-20}
  out=$(mktemp -d /tmp/talos-profile.XXXXXX)
  pprof=(--pprof)
  start sink,control
  addr() { grep 'msg=http ' "$1" | grep -o ' addr=[^ ]*' | head -1 | cut -d= -f2; }
  worker_http=$(addr "$work/worker.log") dev_http=$(addr "$work/dev.log")
  [ -n "$worker_http" ] && [ -n "$dev_http" ] || { echo "no pprof address in the talosd logs" >&2; exit 1; }
  rate=${3:-0} post=()
  [ "${4:-}" = post ] && post=(--post) && echo "== every call also sends its post event (flight)"
  if [ "$rate" -gt 0 ]; then
    calls=$(((secs + 5) * rate)) pace=(--rate "$rate")
    echo "== paced load: $calls calls at $rate calls/s offered (about $((secs + 5)) s), 100 enforcement points; CPU profiles over $secs s of it"
  else
    echo "== probing saturation (10,000 calls)"
    bench --calls 10000 --concurrency 100 --rate 0 --inflight 4 ${post[@]+"${post[@]}"} --json-out "$work/probe.json" >/dev/null
    sat=$(awk -v x="$(jf "$work/probe.json" decisions_per_sec)" 'BEGIN{printf "%.0f", x}')
    calls=$(((secs + 5) * sat)) pace=(--rate 0 --inflight 4)
    echo "== saturation load: $calls calls (about $((secs + 5)) s at $sat decisions/s), 100 enforcement points, 4 in flight each; CPU profiles over $secs s of it"
  fi
  bench --calls "$calls" --concurrency 100 "${pace[@]}" ${post[@]+"${post[@]}"} --json-out "$out/bench.json" \
    --cpu-profile "$out/talosctl.pprof" --started-file "$work/started" >"$out/bench.txt" &
  load=$!
  for _ in $(seq 1 1200); do
    [ ! -e "$work/started" ] && kill -0 $load 2>/dev/null || break
    sleep 0.1
  done
  [ -e "$work/started" ] || { cat "$out/bench.txt"; echo "the load did not start" >&2; exit 1; }
  sleep 1 # past the first fill of the pipeline
  curl -sf -o "$out/worker.pprof" "http://$worker_http/debug/pprof/profile?seconds=$secs" &
  p1=$!
  curl -sf -o "$out/dev.pprof" "http://$dev_http/debug/pprof/profile?seconds=$secs" &
  p2=$!
  wait $p1
  wait $p2
  curl -sf -o "$out/worker.heap.pprof" "http://$worker_http/debug/pprof/heap"
  curl -sf -o "$out/dev.heap.pprof" "http://$dev_http/debug/pprof/heap"
  wait $load
  cat "$out/bench.txt"
  mkdir -p "$out/bin"
  cp "$work/bin/talosd" "$work/bin/talosctl" "$out/bin/"
  for p in worker dev talosctl; do
    echo "== $p: top functions by CPU ($out/$p.pprof)"
    go tool pprof -top -nodecount 15 "$out/$p.pprof" 2>/dev/null | sed -n '1,/^ *flat /d; p' | head -15 | sed 's/^/   /'
  done
  echo "== profiles in $out: enforce worker (worker.pprof, worker.heap.pprof), NATS + sink (dev.pprof, dev.heap.pprof), load generator (talosctl.pprof; its timed part), with the binaries in bin/; e.g."
  echo "   go tool pprof -top $out/bin/talosd $out/worker.pprof"
  echo "   go tool pprof -http=127.0.0.1:0 $out/bin/talosd $out/dev.pprof"
  ;;
killswitch)
  rounds=${2:-4} rate=${3:-2000}
  echo "== latency at $rate calls/s (100 enforcement points, 2 KB envelopes, 30,000 calls) with 100 kill-switch rounds alongside and without:"
  echo "   each round a fresh stack runs both, the first run of odd rounds with control traffic, of even rounds without"
  for i in $(seq 1 "$rounds"); do
    start sink,control
    ks=(--responder-key "$work/dev/keys/responder.key")
    if [ "$i" = 1 ]; then
      # What the rounds cost by themselves: back to back, as during the runs.
      d0=$(cpu $dev) w0=$(cpu $worker) c0=$(cpu $chpid) t0=$(date +%s%N)
      bench --calls 0 --killswitch 100 "${ks[@]}" >/dev/null
      d1=$(cpu $dev) w1=$(cpu $worker) c1=$(cpu $chpid) t1=$(date +%s%N)
      echo "   the 100 rounds alone on round 1's idle stack: $(awk -v ns=$((t1 - t0)) 'BEGIN{printf "%.2f", ns / 1e9}') s; CPU per command: enforce worker $(per $((w1 - w0)) 200) µs, NATS + sink + control service $(per $((d1 - d0)) 200) µs, ClickHouse $(per $((c1 - c0)) 200) µs"
      printf '   %-6s %-10s %-24s %12s %9s %9s %9s %10s %14s\n' round "stack run" "control traffic" "decisions/s" "p50 ms" "p90 ms" "p99 ms" "max ms" "ks after ack p99"
    fi
    order="with without"
    [ $((i % 2)) -eq 1 ] || order="without with"
    n=0
    for o in $order; do
      n=$((n + 1))
      rounds_flags=() label=none
      [ "$o" = without ] || rounds_flags=(--killswitch 100 "${ks[@]}") label="100 kill-switch rounds"
      bench --calls 30000 --concurrency 100 --rate "$rate" ${rounds_flags[@]+"${rounds_flags[@]}"} --json-out "$work/ks.json" >/dev/null
      ksp=-
      [ "$o" = without ] || ksp="$(jf "$work/ks.json" after_ack_p99_ms) ms"
      printf '   %-6s %-10s %-24s %12.0f %9.2f %9.2f %9.2f %10.2f %14s\n' "$i" "$n" "$label" "$(jf "$work/ks.json" decisions_per_sec)" \
        "$(jf "$work/ks.json" decision_p50_ms)" "$(jf "$work/ks.json" decision_p90_ms)" "$(jf "$work/ks.json" decision_p99_ms)" \
        "$(jf "$work/ks.json" decision_max_ms)" "$ksp"
      echo "$i $o $(jf "$work/ks.json" decision_p50_ms) $(jf "$work/ks.json" decision_p99_ms)" >>"$work/ks.rows"
    done
    stop_all
  done
  # Medians of each arm, and of the ratio with/without within each round
  # (its two runs back to back on one stack).
  for o in with without; do
    awk -v o="$o" 'BEGIN{print "p50 p99"} $2 == o {print $3, $4}' "$work/ks.rows" >"$work/ks.$o"
  done
  awk '{v[$1" "$2]=$4; n=$1} END{print "ratio"; for (i=1; i<=n; i++) if ((i" with") in v && (i" without") in v && v[i" without"] > 0) print v[i" with"] / v[i" without"]}' "$work/ks.rows" >"$work/ks.ratio"
  echo "== medians: p50 / p99 $(median "$work/ks.with" 1) / $(median "$work/ks.with" 2) ms with kill-switch rounds, $(median "$work/ks.without" 1) / $(median "$work/ks.without" 2) ms without;"
  echo "   p99 with / without within each round: $(awk 'NR>1{printf "%s%.2f", (NR>2 ? " / " : ""), $1}' "$work/ks.ratio"), median $(median "$work/ks.ratio" 1)"
  ;;
tail)
  rate=${2:-1000}
  calls=$((rate * 15))
  # paced_run [bench flags…]: the run at $rate, then the CPU per call of
  # the worker and of the dev process (NATS, and the sink when it runs
  # there) over it, from its first publish until its last record is
  # counted where it goes.
  paced_run() {
    local d0 w0 d1 w1
    d0=$(cpu $dev); w0=$(cpu $worker)
    bench --calls "$calls" --concurrency 100 --rate "$rate" "$@" | grep -E "p99|end to end"
    d1=$(cpu $dev); w1=$(cpu $worker)
    echo "   CPU per call: enforce worker $(per $((w1 - w0)) "$calls") µs, dev process $(per $((d1 - d0)) "$calls") µs"
  }
  echo "== latency at $rate calls/s (100 enforcement points, 15 s) with no sink and no ClickHouse load"
  start control
  paced_run --no-clickhouse
  stop_all
  echo "== the same with the sink as its own process, equal CPU priority"
  start control "" sink
  paced_run
  stop_all
  echo "== the same with the sink and ClickHouse at nice 10"
  start control 10
  paced_run
  ;;
tls)
  rate=${2:-500} rounds=${3:-2}
  calls=$((rate * 15))
  echo "== what TLS on NATS costs: $calls calls at $rate calls/s (100 enforcement points) on a fresh stack per run,"
  echo "   with TLS (every process outside the NATS process connects over it) and with --insecure-nats-plaintext, alternately, $rounds round(s)"
  echo "   per call, over the whole run (its last records' way into ClickHouse included): CPU (µs) and write / read system calls"
  echo "   (/proc/PID/io) of the NATS process (NATS, sink, control) and of the worker; the CPU of ClickHouse and of the load"
  echo "   generator (its timed part), all four together, and how many of the machine's $(nproc) cores were busy over the run"
  printf '   %-6s %5s %7s %7s %8s %6s %6s %9s %6s %6s %6s %8s %8s %6s\n' arm round "p50 ms" "p99 ms" "NATS µs" writes reads "worker µs" writes reads "CH µs" "load µs" "all µs" cores
  for arm in tls plain; do echo "arm p50 p99 dev_us dev_w dev_r worker_us worker_w worker_r ch_us gen_us all_us cores" >"$work/tls.$arm.tsv"; done
  # tls_run ARM ROUND: one run, one row.
  tls_run() {
    local arm=$1 d0 w0 c0 m0 t0 d1 w1 c1 m1 t1 ds0 ws0 ds1 ws1 row
    dev_flags=()
    [ "$arm" = tls ] || dev_flags=(--insecure-nats-plaintext)
    start sink,control
    d0=$(cpu $dev) w0=$(cpu $worker) c0=$(cpu $chpid) m0=$(busy) t0=$(date +%s%N) ds0=$(sysc $dev) ws0=$(sysc $worker)
    bench --calls "$calls" --concurrency 100 --rate "$rate" --json-out "$work/tls.json" >/dev/null
    d1=$(cpu $dev) w1=$(cpu $worker) c1=$(cpu $chpid) m1=$(busy) t1=$(date +%s%N) ds1=$(sysc $dev) ws1=$(sysc $worker)
    stop_all
    row=$(awk -v arm="$arm" -v n="$calls" -v p50="$(jf "$work/tls.json" decision_p50_ms)" -v p99="$(jf "$work/tls.json" decision_p99_ms)" \
      -v gen="$(jf "$work/tls.json" loadgen_cpu_us_per_call)" -v dc=$((d1 - d0)) -v wc=$((w1 - w0)) -v cc=$((c1 - c0)) \
      -v m=$((m1 - m0)) -v ns=$((t1 - t0)) -v ds0="$ds0" -v ds1="$ds1" -v ws0="$ws0" -v ws1="$ws1" 'BEGIN{
        split(ds0, a, " "); split(ds1, b, " "); split(ws0, c, " "); split(ws1, d, " ")
        du = dc * 10000 / n; wu = wc * 10000 / n; cu = cc * 10000 / n
        printf "%s %.2f %.2f %.0f %.1f %.1f %.0f %.1f %.1f %.0f %.0f %.0f %.2f", arm, p50, p99, du, (b[1] - a[1]) / n, (b[2] - a[2]) / n,
          wu, (d[1] - c[1]) / n, (d[2] - c[2]) / n, cu, gen, du + wu + cu + gen, m / 100 / (ns / 1e9) }')
    echo "$row" >>"$work/tls.$arm.tsv"
    echo "$row" | awk -v i="$2" '{printf "   %-6s %5s %7s %7s %8s %6s %6s %9s %6s %6s %6s %8s %8s %6s\n", $1, i, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13}'
  }
  for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) -eq 1 ]; then tls_run tls "$i"; tls_run plain "$i"; else tls_run plain "$i"; tls_run tls "$i"; fi
  done
  echo "== medians, TLS / plaintext:"
  c=1
  for name in p50_ms p99_ms NATS_µs NATS_writes NATS_reads worker_µs worker_writes worker_reads CH_µs load_gen_µs all_µs cores_busy; do
    c=$((c + 1))
    awk -v l="$name" -v t="$(median "$work/tls.tls.tsv" $c)" -v p="$(median "$work/tls.plain.tsv" $c)" \
      'BEGIN{printf "   %-14s %9.2f %9.2f %6s\n", l, t, p, (p > 0 ? sprintf("%.2f", t / p) : "-")}'
  done
  ;;
procs)
  rounds=${2:-2}
  echo "== one P (GOMAXPROCS=1) against Go's default ($(nproc), one per CPU), both for the worker and for the NATS process;"
  echo "   alternately, $rounds round(s), each arm on a fresh stack (the load generator keeps Go's default); at 500 and"
  echo "   2,000 calls/s offered (10 s each) and at saturation (40,000 calls, 4 in flight per point), 100 enforcement points."
  echo "   Per call over each run (its last records' way into ClickHouse included): CPU (µs) of the worker, of the NATS"
  echo "   process (NATS, sink, control), of ClickHouse and of the load generator (its own report), and the context switches"
  echo "   of the worker's and of the NATS process's threads"
  # One row per run: arm, round, then the columns of procs.ARM.tsv after arm.
  row_fmt='   %-7s %5s %6s %10s %7s %7s %9s %8s %6s %6s %9s %8s\n'
  # shellcheck disable=SC2059 # the format is row_fmt
  printf "$row_fmt" arm round rate "decided/s" "p50 ms" "p99 ms" "worker µs" "NATS µs" "CH µs" "gen µs" "worker cs" "NATS cs"
  for arm in one default; do echo "arm rate decided p50 p99 worker_us dev_us ch_us gen_us worker_cs dev_cs" >"$work/procs.$arm.tsv"; done
  # procs_run ARM ROUND: one stack, a row per rate.
  procs_run() {
    local arm=$1 r n d0 w0 c0 wc0 dc0 d1 w1 c1 wc1 dc1 row pace
    worker_env=() dev_env=()
    [ "$arm" = default ] || worker_env=(GOMAXPROCS=1) dev_env=(GOMAXPROCS=1)
    start sink,control
    for r in 500 2000 0; do
      if [ "$r" = 0 ]; then n=40000 pace=(--rate 0 --inflight 4); else n=$((r * 10)) pace=(--rate "$r"); fi
      d0=$(cpu $dev) w0=$(cpu $worker) c0=$(cpu $chpid) wc0=$(csw $worker) dc0=$(csw $dev)
      bench --calls "$n" --concurrency 100 "${pace[@]}" --json-out "$work/procs.json" >/dev/null
      d1=$(cpu $dev) w1=$(cpu $worker) c1=$(cpu $chpid) wc1=$(csw $worker) dc1=$(csw $dev)
      row=$(awk -v arm="$arm" -v r="${r/#0/sat}" -v n="$n" -v dec="$(jf "$work/procs.json" decisions_per_sec)" \
        -v p50="$(jf "$work/procs.json" decision_p50_ms)" -v p99="$(jf "$work/procs.json" decision_p99_ms)" \
        -v gen="$(jf "$work/procs.json" loadgen_cpu_us_per_call)" -v dc=$((d1 - d0)) -v wc=$((w1 - w0)) -v cc=$((c1 - c0)) \
        -v wcs=$((wc1 - wc0)) -v dcs=$((dc1 - dc0)) 'BEGIN{
          printf "%s %s %.0f %.2f %.2f %.0f %.0f %.0f %.0f %.1f %.1f", arm, r, dec, p50, p99, wc * 10000 / n, dc * 10000 / n,
            cc * 10000 / n, gen, wcs / n, dcs / n }')
      echo "$row" >>"$work/procs.$arm.tsv"
      echo "$row" | awk -v i="$2" -v f="$row_fmt" '{printf f, $1, i, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}'
    done
    stop_all
  }
  for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) -eq 1 ]; then procs_run one "$i"; procs_run default "$i"; else procs_run default "$i"; procs_run one "$i"; fi
  done
  echo "== medians, one P / default, by rate; then the median of the ratios within rounds (the rounds' ratios, sorted)"
  printf '   %-6s %-10s %9s %9s %6s   %s\n' rate figure "one P" default ratio "within rounds"
  for r in 500 2000 sat; do
    c=2
    for name in decided/s p50_ms p99_ms worker_µs NATS_µs CH_µs gen_µs worker_cs NATS_cs; do
      c=$((c + 1))
      a=$(median <(awk -v r="$r" 'NR == 1 || $2 == r' "$work/procs.one.tsv") $c)
      f=$(median <(awk -v r="$r" 'NR == 1 || $2 == r' "$work/procs.default.tsv") $c)
      # The ratio within each round (its two arms ran back to back; the
      # two files' rows pair up, k columns each), and their median.
      w=$(paste -d' ' <(tail -n +2 "$work/procs.one.tsv") <(tail -n +2 "$work/procs.default.tsv") |
        awk -v r="$r" -v c="$c" -v k="$(head -1 "$work/procs.one.tsv" | wc -w)" '$2 == r && $(c + k) > 0 {printf "%.2f\n", $c / $(c + k)}' | sort -g |
        awk '{v[NR] = $1; s = s (NR > 1 ? " " : "") $1} END {if (NR) printf "%.2f (%s)", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, s}')
      awk -v r="$r" -v l="$name" -v a="$a" -v f="$f" -v w="$w" 'BEGIN{printf "   %-6s %-10s %9.2f %9.2f %6s   %s\n", r, l, a, f, (f > 0 ? sprintf("%.2f", a / f) : "-"), w}'
    done
  done
  ;;
sustained)
  runs=${2:-6}
  limits=("${@:3}")
  [ ${#limits[@]} -gt 0 ] || limits=(talosd)
  echo "== sustained throughput: $runs runs of 40,000 calls at saturation on one stack (100 enforcement points, 4 in flight each)"
  echo "   every pre call leaves a TALOS_LEDGER key for --replay-window (24 h), and NATS keeps an index entry per key in memory"
  summary=()
  pprof=(--pprof) # the dev process's heap after a collection (/debug/pprof/heap?gc=1&debug=1)
  heap() { curl -sf "http://$dev_http/debug/pprof/heap?gc=1&debug=1" | sed -n 's/^# HeapAlloc = \([0-9]*\).*/\1/p'; }
  for limit in "${limits[@]}"; do
    # gctrace: the dev process logs each garbage collection, counted per run.
    dev_env=(GODEBUG=gctrace=1)
    [ "$limit" = talosd ] || dev_env+=(GOMEMLIMIT="$limit")
    start sink,control
    dev_http=$(grep 'msg=http ' "$work/dev.log" | grep -o ' addr=[^ ]*' | head -1 | cut -d= -f2)
    h0=$(heap)
    echo "== the NATS process's soft memory limit: $limit ($([ "$limit" = talosd ] && echo "talosd's own: half the memory available, at least 1 GiB" || echo GOMEMLIMIT))"
    printf '   %4s %12s %12s %10s %9s %13s %9s %14s %12s\n' run "calls so far" decisions/s "e2e ev/s" "worker µs" "NATS+sink µs" "CH µs" "NATS RSS MiB" "NATS GCs"
    total=0
    for i in $(seq 1 "$runs"); do
      g0=$(grep -c '^gc ' "$work/dev.log" || true)
      saturate sustained 40000
      g1=$(grep -c '^gc ' "$work/dev.log" || true)
      total=$((total + 40000))
      printf '   %4d %12d %12.0f %10.0f %9d %13d %9d %14s %12d\n' "$i" "$total" "$(jf "$work/sustained.json" decisions_per_sec)" \
        "$(jf "$work/sustained.json" e2e_events_per_sec)" "$cpu_worker" "$cpu_dev" "$cpu_ch" \
        "$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$dev/status")" $((g1 - g0))
    done
    summary+=("$(printf '   %-10s %12.0f %10.0f %9d %13d %14s' "$limit" "$(jf "$work/sustained.json" decisions_per_sec)" \
      "$(jf "$work/sustained.json" e2e_events_per_sec)" "$cpu_worker" "$cpu_dev" "$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$dev/status")")")
    # What the NATS process holds per call: for the 2-minute windows (the
    # duplicate windows, TALOS_DECISIONS), then past them (TALOS_LEDGER).
    h1=$(heap)
    sleep 130
    h2=$(heap)
    echo "== the NATS process's live heap: $((h0 >> 20)) MiB before the runs, $((h1 >> 20)) MiB after them, $((h2 >> 20)) MiB 130 s later:" \
      "$(((h1 - h2) / total)) bytes per call for 2 minutes, $(((h2 - h0) / total)) bytes per call for --replay-window"
    stop_all
  done
  if [ ${#limits[@]} -gt 1 ]; then
    echo "== the last run of each stack (after $total calls), in the order run"
    printf '   %-10s %12s %10s %9s %13s %14s\n' limit decisions/s "e2e ev/s" "worker µs" "NATS+sink µs" "NATS RSS MiB"
    printf '%s\n' "${summary[@]}"
  fi
  ;;
verify)
  n=${2:-1000000}
  profdir= base_rev= rounds=1
  case "${3:-}" in
  profile) profdir=$(mktemp -d /tmp/talos-verify-profile.XXXXXX) ;;
  ab)
    base_rev=$(git rev-parse --verify --quiet "${4:-HEAD}^{commit}") || { echo "no such commit: ${4:-}" >&2; exit 2; }
    rounds=${5:-3}
    mkdir -p "$work/base/src" "$work/base/bin"
    git archive "$base_rev" | tar -x -C "$work/base/src"
    (cd "$work/base/src" && go build -o "$work/base/bin/talosctl" ./cmd/talosctl)
    ;;
  "") ;;
  *) echo "verify [N] [profile | ab BASE [ROUNDS]]: unknown $3" >&2; exit 2 ;;
  esac
  start control
  echo "== writing $n signed receipts in 4 chains, a checkpoint every 1,000 (talosctl synth)"
  # Database synth is not talosd dev's: its writer and reader see only
  # talos, so synth (which creates the database) and verify log in as the admin.
  "$work/bin/talosctl" --clickhouse-addr "$ch" --clickhouse-user default --clickhouse-database synth synth --receipts "$n" --chains 4 \
    --checkpoint-every 1000 --key-out "$work/synth" 2>/dev/null
  echo "== exporting them: talosctl export --kind all (receipts in chain order, then the checkpoints)"
  "$work/bin/talosctl" --clickhouse-addr "$ch" --clickhouse-user default --clickhouse-database synth export --kind all \
    --out "$work/export.jsonl" 2>/dev/null
  echo "   $(wc -l <"$work/export.jsonl") records, $(($(stat -c %s "$work/export.jsonl") >> 20)) MiB"
  # The same lines in another order, the same for every run (shuf with a
  # fixed random source): verify --file reads it through an index.
  shuf --random-source=<(yes) "$work/export.jsonl" >"$work/shuffled.jsonl"
  # The id of the export's middle receipt: the last "id" member of its
  # line (a CloudEvent's members are sorted: data, then id).
  proof_id=$(sed -n "$((n / 2))p" "$work/export.jsonl" | grep -o '"id":"[^"]*"' | tail -1 | cut -d'"' -f4)
  # verify_run SIDE MODE: one talosctl verify over the synth database by
  # SIDE's talosctl (new: this tree's, base: BASE's), signatures checked
  # one by one with crypto/ed25519's rules (MODE default) or in batches
  # (batch: --batch-signatures, RFC 8032's cofactored equation, a failing
  # batch rechecked one by one), or over its export (file: --file, one
  # by one; shuffled: the same over its lines in another order), or the
  # proof of one receipt from it (proof: its receipts/s
  # are the file's receipts over the wall time); prints and records
  # receipts/s and peak RSS, with the round ($r, 1 without rounds).
  verify_run() {
    local side=$1 mode=$2 bin=$work/bin/talosctl flags=() what="over ClickHouse: every signature, link, Merkle root and stored column"
    [ "$side" = base ] && bin=$work/base/bin/talosctl
    [ "$mode" = batch ] && flags=(--batch-signatures)
    [ "$mode" = file ] && flags=(--file "$work/export.jsonl") what="over the export: every signature, link and Merkle root"
    [ "$mode" = shuffled ] && flags=(--file "$work/shuffled.jsonl") what="over the export's lines shuffled (out of chain order): the same checks"
    [ "$mode" = proof ] && flags=(--file "$work/export.jsonl" --receipt "$proof_id" --out "$work/proof.json") \
      what="the inclusion proof of the file's middle receipt (its receipts/s: the file's receipts over the wall time)"
    [ -n "$profdir" ] && flags+=(--cpuprofile "$profdir/verify-$mode.pprof")
    echo "== ${base_rev:+$side: }talosctl verify ${flags[*]} $what"
    if ! /usr/bin/time -f "%e s wall, %M KiB peak RSS, %P CPU" -o "$work/verify.time" \
      "$bin" --clickhouse-addr "$ch" --clickhouse-user default --clickhouse-database synth verify --trusted-keys "$work/synth.pub" "${flags[@]}" \
      >"$work/verify.out" 2>"$work/verify.err"; then
      tail -20 "$work/verify.out"; tr '\r' '\n' <"$work/verify.err" | tail -5; exit 1
    fi
    if [ "$mode" = proof ]; then head -1 "$work/verify.err"; else tail -1 "$work/verify.out"; fi
    cat "$work/verify.time"
    awk -v n="$n" -v m="$mode" '{printf "== verification (%s): %.0f receipts/s, peak RSS %.0f MiB\n", m, n/$1, $4/1024}' "$work/verify.time"
    awk -v n="$n" -v s="$side" -v m="$mode" -v r="${r:-1}" '{printf "%s %s %.0f %.0f %d\n", s, m, n/$1, $4/1024, r}' "$work/verify.time" >>"$work/verify.all"
  }
  modes="default batch file shuffled proof"
  echo "side mode receipts_per_s peak_rss_mib round" >"$work/verify.all"
  if [ -z "$base_rev" ]; then
    for mode in $modes; do verify_run new "$mode"; done
  else
    echo "== A/B: base $(git rev-parse --short "$base_rev") ($(git log -1 --format=%s "$base_rev" | cut -c1-60)) against this tree, $rounds round(s) on one database, alternating (base first in odd rounds)"
    for r in $(seq 1 "$rounds"); do
      order="base new"
      [ $((r % 2)) -eq 0 ] && order="new base"
      for mode in $modes; do
        for side in $order; do verify_run "$side" "$mode"; done
      done
    done
    echo "== receipts/s and peak RSS (MiB), medians of $rounds round(s) (new/base), and receipts/s new/base within each round"
    for mode in $modes; do
      # of SIDE COLUMN: the median of a column of SIDE's runs of this mode.
      of() { median <(awk -v s="$1" -v m="$mode" 'NR == 1 || ($1 == s && $2 == m)' "$work/verify.all") "$2"; }
      within=$(awk -v m="$mode" '$2 == m {v[$1 "," $5] = $3} END {for (i = 1; ("new," i) in v; i++) printf " %.2f", v["new," i] / v["base," i]}' "$work/verify.all")
      awk -v m="$mode" -v b="$(of base 3)" -v n="$(of new 3)" -v br="$(of base 4)" -v nr="$(of new 4)" -v w="$within" \
        'BEGIN {printf "   %-8s base %7d  new %7d  ratio %.2f (rounds:%s)   RSS base %5d  new %5d  ratio %.2f\n", m, b, n, n / b, w, br, nr, nr / br}'
    done
  fi
  if [ -n "$profdir" ]; then
    cp "$work/bin/talosctl" "$profdir/"
    echo "== CPU profiles: go tool pprof -top $profdir/talosctl $profdir/verify-batch.pprof (and verify-default, -file, -shuffled, -proof.pprof)"
  fi
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
  # busy: a `go test` runs, and BENCH_NO_IDLE=1 does not say to ignore it.
  busy() { [ "${BENCH_NO_IDLE:-}" != 1 ] && pgrep -f 'go test' >/dev/null; }
  wait_idle() {
    local n=0
    while busy; do
      [ $n -eq 0 ] && echo "== waiting for the running 'go test' to finish (the machine must be otherwise idle)"
      n=$((n + 1))
      [ $n -lt 360 ] || { echo "still busy after 30 minutes; giving up" >&2; exit 1; }
      sleep 5
    done
  }
  [ "${BENCH_NO_IDLE:-}" = 1 ] && echo "== BENCH_NO_IDLE=1: not waiting for an idle machine; these figures are not for BENCHMARKS.md"
  wait_idle
  registry=deploy/mcp/registry eps=talosctl,demo-ep,gw-bench,gw-http,gw-https scope='tool:everything:*'
  start sink,control
  gw="$work/bin/talos-mcp-gateway --ep-id gw-bench --registry $registry --nats-url $nats"
  gw+=" --nats-auth $work/dev/nats-auth.json --capability $work/cap.json --agent-key $work/dev/keys/demo-agent.key"
  gw+=" --session-id gw-bench --log-level warn --upstream 'everything=$everything' --spool-dir $work/spool/gw-bench ${BENCH_GATEWAY_FLAGS:-}"
  # HTTP mode: a CA and server certificate for 127.0.0.1, an issuer's JWKS
  # and a JWT it signed, a static token, and one principal that either
  # token reaches, calling with the same capability and key as stdio.
  issuer=https://bench-issuer.talos.test audience=talos-mcp-gateway creds=$work/creds
  "$work/bin/benchcreds" -issuer "$issuer" -audience "$audience" -subject bench-agent \
    -capability "$work/cap.json" -agent-key "$work/dev/keys/demo-agent.key" "$creds"
  # bench_mcp NAME [bench-mcp flags]: one comparison against the direct
  # server, its report shown and kept in $work/NAME.out.
  bench_mcp() {
    local name=$1
    shift
    wait_idle
    echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$work/bin/talosctl" bench-mcp --calls "$calls" --warmup "$warmup" --stderr "$work/servers.log" \
      --direct "everything=$everything" "$@" >"$work/$name.out" || { cat "$work/$name.out"; tail -20 "$work/servers.log"; exit 1; }
    cat "$work/$name.out"
    if busy; then
      echo "== a 'go test' started during the measurement: these figures are not of an idle machine; run again" >&2
      exit 1
    fi
  }
  # evidence EP: every echo call through the gateway EP went through Talos:
  # its allowed pre decisions, post receipts and ToolCallEvents, in
  # ClickHouse. The server's own requests to the client through the gateway
  # (mcp-server-everything asks for roots/list once) are decided and
  # recorded too, under their method's name; they are not counted here.
  evidence() {
    local want=$((calls + warmup)) got events
    chq() { clickhouse-client --host "${ch%:*}" --port "${ch##*:}" -q "$1"; }
    for _ in $(seq 1 120); do
      got=$(chq "SELECT uniqExactIf(tool_call_id, phase = 'pre' AND decision = 'allow'), uniqExactIf(tool_call_id, phase = 'post') FROM talos.receipts WHERE ep_id = '$1' AND tool_name = 'echo'" | tr '\t' ' ')
      events=$(chq "SELECT uniqExact(tool_call_id) FROM talos.tool_calls WHERE ep_id = '$1' AND tool_name = 'echo'")
      [ "$got" = "$want $want" ] && [ "$events" = "$want" ] && break
      sleep 0.5
    done
    echo "== in ClickHouse for $1 (warm-up included, $want calls): allowed pre decisions and post receipts: $got; ToolCallEvents: $events"
    [ "$got" = "$want $want" ] && [ "$events" = "$want" ] || { echo "some gateway calls left no receipt or ToolCallEvent" >&2; exit 1; }
  }
  # http_gateway EP URL [flags]: the gateway in HTTP mode as EP, in front of
  # its own mcp-server-everything, listening at URL's host:port, with the
  # principal of $creds; returns once /healthz answers. Sets gwpid.
  http_gateway() {
    local ep=$1 url=$2 hostport
    shift 2
    hostport=${url#*://}; hostport=${hostport%%/*}
    "$work/bin/talos-mcp-gateway" --ep-id "$ep" --registry "$registry" --nats-url "$nats" \
      --nats-auth "$work/dev/nats-auth.json" --log-level warn --upstream "everything=$everything" \
      --listen "$hostport" --principals "$creds/principals.json" --spool-dir "$work/spool/$ep" ${BENCH_GATEWAY_FLAGS:-} "$@" >>"$work/servers.log" 2>&1 &
    gwpid=$!; pids+=($gwpid)
    for _ in $(seq 1 60); do curl -fsS --cacert "$creds/ca.pem" "${url%/mcp}/healthz" >/dev/null 2>&1 && return; sleep 0.5; done
    echo "the gateway ($ep) did not become healthy:" >&2; tail -20 "$work/servers.log" >&2; exit 1
  }
  stop_gateway() { kill -INT "$gwpid"; wait "$gwpid" || true; } # it drains its post events first
  # stages NAME URL [curl flags]: the gateway's own timing of the requests
  # it had decided (talos_gateway_stage_seconds on its /metrics, warm-up
  # included): the mean of each stage in ms, shown and kept in
  # $work/NAME.stages (decision, upstream, post). Decision and post are
  # most of what Talos adds inside the gateway; the rest of the added
  # latency is the second hop (client → gateway → server) and the
  # gateway's work outside the stages (the envelope, signed).
  stages() {
    local name=$1 url=$2
    shift 2
    curl -fsS "$@" "${url%/mcp}/metrics" | awk -v name="$name" -v out="$work/$name.stages" '
      /^talos_gateway_stage_seconds_(sum|count)\{/ {
        match($0, /stage="[a-z]+"/); s = substr($0, RSTART + 7, RLENGTH - 8)
        if ($1 ~ /_sum/) sum[s] = $2; else n[s] = $2
      }
      END {
        for (s in n) mean[s] = n[s] > 0 ? 1000 * sum[s] / n[s] : 0
        printf "%.3f %.3f %.3f\n", mean["decision"], mean["upstream"], mean["post"] > out
        printf "== %s: the gateway'"'"'s own timing over the %d requests it decided, mean ms: decision %.3f, upstream %.3f, post %.3f\n", name, n["decision"], mean["decision"], mean["upstream"], mean["post"]
      }'
  }
  echo "== node $(node --version), mcp-server-everything $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$(dirname "$everything")/../@modelcontextprotocol/server-everything/package.json" 2>/dev/null | head -1)"
  echo "== gateway added latency: $calls calls of everything/echo per side, directly and through talos-mcp-gateway, interleaved"
  echo "   the gateway signs each call with a capability chain; the worker runs every default check; the sink"
  echo "   projects receipts and ToolCallEvents into ClickHouse meanwhile (the full pipeline is busy, on the same cores)"
  echo "== 1/3 stdio: the gateway a child process of the client, in front of its own mcp-server-everything"
  bench_mcp stdio --via "gw=$gw"
  evidence gw-bench
  [ "${3:-}" = stdio ] && exit 0
  echo "== stdio, prompts/get and resources/read: decided, receipted and recorded like tools/call (a prompt and a resource template the registry lists)"
  bench_mcp prompt --via "gw=$gw" --prompt simple-prompt --args '{}'
  bench_mcp resource --via "gw=$gw" --resource demo://resource/static/document/architecture.md --args '{}'
  url=http://127.0.0.1:$(port_from 18930)/mcp
  echo "== 2/3 streamable HTTP, plain (--insecure-plain-http on loopback), a static bearer token: $url"
  http_gateway gw-http "$url" --insecure-plain-http
  TALOS_TOKEN=$(cat "$creds/static.token") bench_mcp http --url "$url" # the token in the environment, not in ps
  stages http "$url"
  stop_gateway
  evidence gw-http
  url=https://127.0.0.1:$(port_from 18930)/mcp
  echo "== 3/3 streamable HTTPS (TLS 1.2+, ECDSA P-256 certificate), a JWT (ES256, checked against --jwks-file): $url"
  http_gateway gw-https "$url" --tls-cert "$creds/server.pem" --tls-key "$creds/server.key" \
    --jwt-issuer "$issuer" --jwt-audience "$audience" --jwks-file "$creds/jwks.json"
  TALOS_TOKEN=$(cat "$creds/token.jwt") bench_mcp https --url "$url" --ca "$creds/ca.pem"
  stages https "$url" --cacert "$creds/ca.pem"
  stop_gateway
  evidence gw-https
  # The three side by side, from the reports above (milliseconds).
  echo "== gateway added latency by transport, ms ($calls calls per side; the direct side is always stdio)"
  printf '%-32s %13s %13s %9s %9s %13s %13s\n' transport "direct p50" "via p50" "added p50" "added p99" "per round p50" "per round p99"
  for t in "stdio:stdio" "prompt:stdio, prompts/get" "resource:stdio, resources/read" "http:HTTP plain + static token" "https:HTTPS + JWT"; do
    awk -v name="${t#*:}" '
      $1 == "direct" { d = $2 } $1 == "via" { v = $2 }
      /^added \(via/ { p50 = $5; p99 = $7 }
      /^added per round/ { gsub(",", ""); r50 = $(NF - 4); r99 = $(NF - 1) }
      END { printf "%-32s %13s %13s %9s %9s %13s %13s\n", name, d, v, p50, p99, r50, r99 }' "$work/${t%%:*}.out"
  done
  echo "== inside the HTTP gateways (their talos_gateway_stage_seconds), mean ms per decided request"
  printf '%-32s %9s %9s %9s\n' transport decision upstream post
  for t in "http:HTTP plain + static token" "https:HTTPS + JWT"; do
    read -r dm um pm <"$work/${t%%:*}.stages"
    printf '%-32s %9s %9s %9s\n' "${t#*:}" "$dm" "$um" "$pm"
  done
  ;;
forward)
  calls=${2:-20000}
  . scripts/benchforward.sh
  ;;
log)
  calls=${2:-20000} rounds=${3:-2} rate=${4:-400}
  . scripts/benchlog.sh
  ;;
cluster)
  rounds=${2:-2}
  . scripts/benchcluster.sh
  ;;
esac
