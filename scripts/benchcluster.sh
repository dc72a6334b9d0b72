# `bash scripts/bench.sh cluster [ROUNDS]`: what replication costs, R1
# against R3 streams and buckets on one three-node NATS cluster. Sourced by
# scripts/bench.sh (its bench, saturate's helpers, cpu, jf, per, stop_all,
# $work, $talosd, $talosctl, $registry, $eps, $scope, pids), not run alone.
#
# For each side, alternately (ROUNDS rounds, default 2), everything is
# fresh: a three-node NATS cluster (scripts/benchcluster: embedded
# nats-servers in one process, TLS and the users file as talosd's own),
# `talosd dev` with the sink and control roles against it (its private
# ClickHouse) and one enforce worker, both with --replicas R. Then decision
# p50/p99 at 500 and 1,000 calls/s offered (100 enforcement points, 2 KB
# envelopes, every default check), and a throughput run: decisions/s, end
# to end events/s, and each process's CPU per call (the NATS cluster, the
# sink and control, the worker, ClickHouse).

# start_cluster R: the stack above with R replicas.
start_cluster() {
  local r=$1
  rm -rf "$work/dev" "$work/nodes"
  mkdir -p "$work/dev" "$work/nodes"
  "$work/bin/benchcluster" -dir "$work/nodes" -nats-auth "$work/dev/nats-auth.json" -eps "$eps" >"$work/cluster.out" 2>"$work/cluster.log" &
  natspid=$!; pids+=($natspid)
  for _ in $(seq 1 600); do grep -q '^urls ' "$work/cluster.out" && break; sleep 0.1; done
  grep -q '^urls ' "$work/cluster.out" || { echo "the NATS cluster did not start:" >&2; cat "$work/cluster.log" >&2; exit 1; }
  nats=$(sed -n 's/^urls //p' "$work/cluster.out")
  "$talosd" dev --no-demo --roles sink,control --data-dir "$work/dev" --clickhouse-port 0 --registry "$registry" \
    --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --replicas "$r" --http-addr "" >"$work/dev.log" 2>&1 &
  dev=$!; pids+=($dev)
  for _ in $(seq 1 240); do grep -q "Talos dev stack is up" "$work/dev.log" && break; sleep 0.5; done
  grep -q "Talos dev stack is up" "$work/dev.log" || { cat "$work/dev.log" >&2; exit 1; }
  ch=$(sed -n 's/^  ClickHouse:  \([^ ]*\).*/\1/p' "$work/dev.log")
  chpid=$(pgrep -f "clickhouse-server.*$work" | head -1)
  "$talosd" --roles enforce --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --replicas "$r" --registry "$registry" \
    --signing-key "$work/dev/keys/signing.key" --capability-issuers "$work/dev/keys/issuer.pub" \
    --instance bench-worker --http-addr "" >"$work/worker.log" 2>&1 &
  worker=$!; pids+=($worker)
  "$talosctl" cap issue --issuer-key "$work/dev/keys/issuer.key" --subject demo-agent \
    --subject-key "$work/dev/keys/demo-agent.pub" --scope "$scope" --ttl 6h --out "$work/cap.json" >/dev/null
  sleep 2
  kill -0 "$worker" 2>/dev/null || { echo "the enforce worker did not start:" >&2; cat "$work/worker.log" >&2; exit 1; }
}

echo "== replication: R1 against R3 streams and buckets on a three-node NATS cluster, alternately, $rounds rounds (CPU in µs per call, throughput run)"
printf '   %-5s %-3s %13s %13s %12s %12s %9s %11s %7s %10s\n' round R "p50/p99 @500" "p99 @1000" "decisions/s" "end to end/s" "NATS x3" "sink+ctl" worker ClickHouse
for round in $(seq 1 "$rounds"); do
  for r in 1 3; do
    start_cluster "$r"
    bench --calls 10000 --concurrency 100 --rate 500 --timeout 60s --json >"$work/r$r-500.json"
    bench --calls 10000 --concurrency 100 --rate 1000 --timeout 60s --json >"$work/r$r-1000.json"
    n0=$(cpu $natspid)
    saturate "r$r-tp" 20000
    n1=$(cpu $natspid)
    printf '   %-5s %-3s %13s %13.1f %12.0f %12.0f %9s %11s %7s %10s\n' "$round" "$r" \
      "$(awk -v a="$(jf "$work/r$r-500.json" decision_p50_ms)" -v b="$(jf "$work/r$r-500.json" decision_p99_ms)" 'BEGIN{printf "%.1f/%.1f", a, b}')" \
      "$(jf "$work/r$r-1000.json" decision_p99_ms)" "$(jf "$work/r$r-tp.json" decisions_per_sec)" "$(jf "$work/r$r-tp.json" e2e_events_per_sec)" \
      "$(per $((n1 - n0)) "$(jf "$work/r$r-tp.json" calls)")" "$cpu_dev" "$cpu_worker" "$cpu_ch"
    stop_all
  done
done
