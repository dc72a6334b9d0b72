# `bash scripts/bench.sh forward [CALLS]`: the forward role's figures. Sourced
# by scripts/bench.sh (its start, bench, cpu, jf, port_from, $work, $talosd,
# $nats and pids), not run alone.
#
#   1. TALOS_AUDIT is filled by CALLS calls with their post events (two
#      receipts and a ToolCallEvent per call, and the checkpoints);
#   2. a talosd with only the forward role drains it into a private rsyslogd
#      over TLS (RFC 5425, octet-counted RFC 5424; its config as testenv's:
#      a direct queue writing to a file), then, on a new consumer, into an
#      HTTP event collector in Splunk HEC's format (scripts/benchsiem):
#      events/s from the first event delivered until the lag is 0, and the
#      forward process's CPU per event;
#   3. decision latency at 400 calls/s offered (about half the flight
#      recorder's saturation, so the figures are latency, not queueing),
#      each call with its post event, in turn (two rounds): off (no
#      tracing, no forwarding), traced (every call names a sampled parent
#      span, talosctl bench --traced, and the worker, started with
#      OTEL_EXPORTER_OTLP_ENDPOINT, exports a decision span per envelope to
#      an OpenTelemetry Collector: OTLP/HTTP in, a file out; off, the calls
#      name none and the worker records nothing) and both (traced, and
#      forwarding to both destinations). Then the spans the collector
#      received and how far behind the forwarder was when each run with it
#      ended.

# metric PORT NAME DEST: one series of the forward process's /metrics.
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v k="$2{destination=\"$3\"}" '$1 == k {print $2; exit}'; }

# The collector the worker exports its spans to (OTLP/HTTP).
otlpport=$(port_from 18800) otlpgrpc=$(port_from 18825)
mkdir -p "$work/otel"
cat >"$work/otel/config.yaml" <<EOF
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "127.0.0.1:$otlpgrpc"}
      http: {endpoint: "127.0.0.1:$otlpport"}
exporters:
  file: {path: "$work/otel/spans.json", flush_interval: 1s}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
EOF
"$work/bin/otelcol" --config "$work/otel/config.yaml" >"$work/otel/collector.log" 2>&1 &
term_pids+=($!)
worker_env=("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$otlpport")
# spans: how many spans the collector has written so far.
spans() { { grep -o '"spanId"' "$work/otel/spans.json" 2>/dev/null || true; } | wc -l; }

start sink,control
rsyslogd=$(command -v rsyslogd || echo /usr/sbin/rsyslogd)
"$work/bin/benchcreds" -capability "$work/cap.json" -agent-key "$work/dev/keys/demo-agent.key" "$work/creds" >/dev/null
rsport=$(port_from 18850) hecport=$(port_from 18900)
mkdir -p "$work/rsyslog"
cat >"$work/rsyslog/rsyslog.conf" <<EOF
global(workDirectory="$work/rsyslog" maxMessageSize="4m" net.enableDNS="off"
  defaultNetstreamDriver="ossl" defaultNetstreamDriverCAFile="$work/creds/ca.pem"
  defaultNetstreamDriverCertFile="$work/creds/server.pem" defaultNetstreamDriverKeyFile="$work/creds/server.key")
main_queue(queue.type="Direct")
module(load="imtcp" streamDriver.name="ossl" streamDriver.mode="1" streamDriver.authMode="anon")
template(name="talos" type="string" string="%pri% %timereported:::date-rfc3339% %hostname% %app-name% %procid% %msgid% %structured-data% %msg%\n")
ruleset(name="received") {
  action(type="omfile" file="$work/rsyslog/received.log" template="talos" ioBufferSize="4m" flushOnTXEnd="on")
}
input(type="imtcp" address="127.0.0.1" port="$rsport" ruleset="received")
EOF
"$rsyslogd" -n -f "$work/rsyslog/rsyslog.conf" -i "$work/rsyslog/pid" >"$work/rsyslog/rsyslogd.log" 2>&1 &
term_pids+=($!)
head -c 24 /dev/urandom | base64 >"$work/hec.token"
"$work/bin/benchsiem" -addr "127.0.0.1:$hecport" -token-file "$work/hec.token" >"$work/benchsiem.log" 2>&1 &
term_pids+=($!)
for _ in $(seq 1 100); do
  { (exec 3<>"/dev/tcp/127.0.0.1/$rsport") && (exec 3<>"/dev/tcp/127.0.0.1/$hecport"); } 2>/dev/null && break
  sleep 0.1
done

# destination TYPE NAME START: one destination of a forward config.
destination() {
  case $1 in
  rsyslog) echo "{\"name\": \"$2\", \"type\": \"syslog\", \"address\": \"127.0.0.1:$rsport\", \"tls\": {\"ca_file\": \"$work/creds/ca.pem\"}, \"start\": \"$3\"}" ;;
  hec) echo "{\"name\": \"$2\", \"type\": \"hec\", \"url\": \"http://127.0.0.1:$hecport/services/collector/event\", \"token_file\": \"$work/hec.token\", \"start\": \"$3\"}" ;;
  esac
}
# forwarder NAME CONFIG: a talosd with only the forward role; sets fpid and fport.
forwarder() {
  fport=$(port_from 18950)
  "$talosd" --roles forward --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --forward-config "$2" \
    --http-addr "127.0.0.1:$fport" --instance bench-forward >"$work/forward-$1.log" 2>&1 &
  fpid=$!; pids+=($fpid)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$fport/healthz" >/dev/null && return; sleep 0.1; done
  echo "the forward role did not start:" >&2; cat "$work/forward-$1.log" >&2; exit 1
}
stop_forwarder() { kill -INT "$fpid"; wait "$fpid" 2>/dev/null || true; }

echo "== filling TALOS_AUDIT: $calls calls from 100 enforcement points, each with its post event (2 receipts + 1 ToolCallEvent per call)"
bench --calls "$calls" --concurrency 100 --rate 0 --inflight 4 --post --json-out "$work/fill.json" | grep -E "decisions|end to end"

for dest in rsyslog hec; do
  echo "{\"destinations\": [$(destination "$dest" "drain-$dest" all)]}" >"$work/drain-$dest.json"
  forwarder "drain-$dest" "$work/drain-$dest.json"
  c0=$(cpu $fpid) t_first="" n_first=0 backlog=0
  for _ in $(seq 1 6000); do
    n=$(metric "$fport" talos_forward_events_total "drain-$dest") lag=$(metric "$fport" talos_forward_lag "drain-$dest")
    n=${n:-0} lag=${lag:-0}
    backlog=$(awk -v a="$backlog" -v b="$lag" 'BEGIN{print (b > a) ? b : a}')
    if [ -z "$t_first" ] && awk -v n="$n" 'BEGIN{exit !(n > 0)}'; then t_first=$(date +%s%N) n_first=$n; fi
    awk -v n="$n" -v l="$lag" -v b="$backlog" 'BEGIN{exit !(l == 0 && b > 0 && n >= b)}' && break
    sleep 0.1
  done
  t_end=$(date +%s%N) c1=$(cpu $fpid)
  stop_forwarder
  awk -v n="$n" -v nf="$n_first" -v t0="$t_first" -v t1="$t_end" -v c="$((c1 - c0))" -v d="$dest" 'BEGIN{
    printf "== drain to %s: %d events, %.0f events/s (from the first delivered until the lag was 0); forward process CPU %.0f µs per event\n",
      (d == "rsyslog" ? "rsyslog over TLS" : "the HTTP event collector (HEC format)"), n, (n - nf) / ((t1 - t0) / 1e9), c * 10000 / n }'
done
got=$(curl -s "http://127.0.0.1:$hecport/count")
echo "== received: rsyslog $(wc -l <"$work/rsyslog/received.log") lines, the HTTP collector $got events"

echo "== decision latency at 400 calls/s offered (100 enforcement points, each call with its post event: about half the flight saturation), tracing and forwarding off and on"
printf '   %-6s %-6s %12s %9s %9s   %s\n' round side "decisions/s" "p50 ms" "p99 ms" "spans exported; forwarder at the run's end (events behind; seconds until caught up)"
for round in 1 2; do
  for side in off traced both; do
    behind="" traced=() s0=$(spans)
    [ "$side" = off ] || traced=(--traced)
    if [ "$side" = both ]; then
      { echo "{\"destinations\": [$(destination rsyslog "live$round-rsyslog" new),"; echo "$(destination hec "live$round-hec" new)]}"; } >"$work/live$round.json"
      forwarder "live$round" "$work/live$round.json"
    fi
    bench --calls 12000 --concurrency 100 --rate 400 --post ${traced[@]+"${traced[@]}"} --json >"$work/ab-$side-$round.json"
    if [ "$side" = both ]; then
      t0=$(date +%s%N)
      sleep 1.1 # one lag poll after the last decision
      for d in rsyslog hec; do
        lag=$(metric "$fport" talos_forward_lag "live$round-$d")
        until [ "$(metric "$fport" talos_forward_lag "live$round-$d")" = 0 ]; do sleep 0.1; done
        behind+="$d ${lag:-?} ($(awk -v t0="$t0" -v t1="$(date +%s%N)" 'BEGIN{printf "%.1f", (t1 - t0) / 1e9}') s); "
      done
      stop_forwarder
    fi
    [ "$side" = off ] || sleep 6 # the worker's span export interval (5 s) and the collector's file flush (1 s)
    behind="$(($(spans) - s0)) spans; $behind"
    printf '   %-6s %-6s %12.0f %9.2f %9.2f   %s\n' "$round" "$side" "$(jf "$work/ab-$side-$round.json" decisions_per_sec)" \
      "$(jf "$work/ab-$side-$round.json" decision_p50_ms)" "$(jf "$work/ab-$side-$round.json" decision_p99_ms)" "$behind"
  done
done
