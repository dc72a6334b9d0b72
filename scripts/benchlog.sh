# `bash scripts/bench.sh log [CALLS]`: the transparency log's figures.
# Sourced by scripts/bench.sh (its start, bench, cpu, jf, port_from, $work,
# $talosd, $nats, pids and term_pids), not run alone.
#
#   1. Two witnesses (litewitness from torchwood, built from
#      testenv/witness; each with its own key) witness the log, a policy
#      needing both: every checkpoint is published only once both cosigned.
#   2. TALOS_AUDIT is filled by CALLS calls with their post events (two
#      receipts and a ToolCallEvent per call: three log entries), then a
#      talosd with only the log role drains it: appends/s from its first
#      append until it has taken everything (talos_log_size on its
#      /metrics), and the log process's CPU per append.
#   3. One run at 400 calls/s offered, each call with its post event, with
#      the log role on, in which scripts/benchlog measures the delay from
#      each record reaching NATS to the first witnessed checkpoint covering
#      it (apart from 4: observing costs as much as the log role itself).
#   4. Decision latency at RATE calls/s offered (default 400), each call with its post
#      event, the log off and on alternately (ROUNDS rounds, default 2),
#      each run on a fresh stack as a deployment runs it (on: the log role
#      in the talosd of NATS and the sink, witnessed, no chain
#      checkpoints), and each process's CPU per call.

origin=bench.talos.test/log
# The witnesses outlive each stack (stop_all): stopped on exit.
wpids=()
trap 'stop_all; for p in "${wpids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
start sink,control
mkdir -p "$work/log"
vkey=$("$talosd" log-key --data-dir "$work/log" --log-origin "$origin")
: >"$work/witnesses.policy"
for w in 1 2; do
  wport=$(port_from $((18700 + 20 * w)))
  mkdir -p "$work/w$w"
  "$work/bin/witness" serve -dir "$work/w$w" -name "witness.bench/w$w" -listen "127.0.0.1:$wport" \
    -litewitness "$work/bin/litewitness" >"$work/w$w/out" 2>"$work/w$w/log" &
  wpids+=($!)
  for _ in $(seq 1 300); do grep -q '^vkey ' "$work/w$w/out" && break; sleep 0.1; done
  grep -q '^vkey ' "$work/w$w/out" || { echo "witness $w did not start:" >&2; cat "$work/w$w/log" >&2; exit 1; }
  "$work/bin/witness" add-log -dir "$work/w$w" -origin "$origin" -vkey "$vkey"
  echo "witness w$w $(sed -n 's/^vkey //p' "$work/w$w/out") http://127.0.0.1:$wport" >>"$work/witnesses.policy"
done
printf 'group both all w1 w2\nquorum both\n' >>"$work/witnesses.policy"

# logrole: a talosd with only the log role (witnessed); sets lpid and lport.
logrole() {
  lport=$(port_from 18780)
  "$talosd" --roles log --nats-url "$nats" --nats-auth "$work/dev/nats-auth.json" --data-dir "$work/log" --log-origin "$origin" \
    --log-witness-policy "$work/witnesses.policy" --http-addr "127.0.0.1:$lport" --instance bench-log >>"$work/log.log" 2>&1 &
  lpid=$!; pids+=($lpid)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$lport/healthz" >/dev/null && return; sleep 0.1; done
  echo "the log role did not start:" >&2; cat "$work/log.log" >&2; exit 1
}
stop_logrole() { kill -INT "$lpid"; wait "$lpid" 2>/dev/null || true; }
logsize() { curl -s "http://127.0.0.1:$lport/metrics" | awk '$1 == "talos_log_size" {printf "%d", $2; exit}'; }
# caught_up: waits until the log role has taken everything (its size unchanged for 2 s).
caught_up() {
  local last=-1 same=0 n
  while [ "$same" -lt 20 ]; do
    n=$(logsize); n=${n:-0}
    if [ "$n" = "$last" ]; then same=$((same + 1)); else same=0 last=$n; fi
    sleep 0.1
  done
}

echo "== filling TALOS_AUDIT: $calls calls from 100 enforcement points, each with its post event (3 log entries per call)"
bench --calls "$calls" --concurrency 100 --rate 0 --inflight 4 --post --json-out "$work/fill.json" | grep -E "decisions|end to end"
logrole
c0=$(cpu $lpid) t_first="" n_first=0 last=0 t_last=0
for _ in $(seq 1 6000); do
  n=$(logsize); n=${n:-0}
  if [ -z "$t_first" ] && [ "$n" -gt 0 ]; then t_first=$(date +%s%N) n_first=$n; fi
  if [ "$n" -gt "$last" ]; then last=$n t_last=$(date +%s%N); fi
  [ -n "$t_first" ] && [ $(( ($(date +%s%N) - t_last) / 1000000 )) -gt 2000 ] && break
  sleep 0.05
done
c1=$(cpu $lpid)
awk -v n="$last" -v nf="$n_first" -v t0="$t_first" -v t1="$t_last" -v c="$((c1 - c0))" 'BEGIN{
  printf "== drain into the witnessed log: %d entries, %.0f appends/s (first append until the last); log process CPU %.0f µs per append\n",
    n, (n - nf) / ((t1 - t0) / 1e9), c * 10000 / n }'
echo "== published checkpoint: $(sed -n 2p "$work/log/tlog/checkpoint") entries, $(grep -c '^— ' "$work/log/tlog/checkpoint") signatures (the log's and both witnesses')"
stop_logrole

# The observer (scripts/benchlog) takes every record over NATS itself, as
# much work again as the log role's: it runs apart from the A/B above.
echo "== record → witnessed checkpoint, at 400 calls/s offered with the log role on (scripts/benchlog observing every record)"
logrole
caught_up
"$work/bin/benchlog" -nats-url "$nats" -nats-auth "$work/dev/nats-auth.json" -log-dir "$work/log/tlog" \
  >"$work/delay.json" 2>"$work/benchlog.log" &
blpid=$!
for _ in $(seq 1 100); do grep -q observing "$work/benchlog.log" && break; sleep 0.1; done
bench --calls 12000 --concurrency 100 --rate 400 --post --json >"$work/delay-run.json"
sleep 5 # the last records' checkpoint: batch, checkpoint interval, both witnesses
kill -TERM "$blpid"; wait "$blpid" 2>/dev/null || true
stop_logrole
echo "   delay p50 / p90 / p99 / max ms: $(jf "$work/delay.json" delay_p50_ms) / $(jf "$work/delay.json" delay_p90_ms) / $(jf "$work/delay.json" delay_p99_ms) / $(jf "$work/delay.json" delay_max_ms) ($(jf "$work/delay.json" records) records)"
# Decision latency, the log off and on, each side a fresh stack as a
# deployment runs it: off, talosd's default (chain checkpoints, no log);
# on, the log role inside the talosd that runs NATS and the sink (what one
# talosd with --roles enforce,sink,control,log is), witnessed by both
# witnesses, with a new origin each run (a fresh log; the witnesses keep
# what they cosigned of the others), and every talosd with
# --no-chain-checkpoints.
# abrun SIDE ROUND: one run at $rate calls/s offered, each call with its
# post event, and each process's CPU per call over it.
abrun() {
  local side=$1 round=$2 w0 d0 c0 n
  w0=$(cpu $worker) d0=$(cpu $dev) c0=$(cpu $chpid)
  bench --calls $((rate * 30)) --concurrency 100 --rate "$rate" --post --json >"$work/ab-$side-$round.json"
  n=$(jf "$work/ab-$side-$round.json" calls)
  printf '   %-6s %-4s %12.0f %9.2f %9.2f %9s %14s %11s\n' "$round" "$side" "$(jf "$work/ab-$side-$round.json" decisions_per_sec)" \
    "$(jf "$work/ab-$side-$round.json" decision_p50_ms)" "$(jf "$work/ab-$side-$round.json" decision_p99_ms)" \
    "$(per $(($(cpu $worker) - w0)) "$n")" "$(per $(($(cpu $dev) - d0)) "$n")" "$(per $(($(cpu $chpid) - c0)) "$n")"
}

stop_all
echo "== decision latency at $rate calls/s offered (100 enforcement points, each call with its post event), the log off and on"
echo "   (a fresh stack each run; on: the log role in the talosd of NATS and the sink, witnessed, no chain checkpoints; CPU in µs per call)"
printf '   %-6s %-4s %12s %9s %9s %9s %14s %11s\n' round side "decisions/s" "p50 ms" "p99 ms" worker "NATS+sink+log" ClickHouse
for round in $(seq 1 "$rounds"); do
  for side in off on; do
    if [ "$side" = on ]; then
      o=$origin-$round
      mkdir -p "$work/ab-log-$round"
      v=$("$talosd" log-key --data-dir "$work/ab-log-$round" --log-origin "$o")
      for w in 1 2; do "$work/bin/witness" add-log -dir "$work/w$w" -origin "$o" -vkey "$v"; done
      dev_flags=(--log-key "$work/ab-log-$round/keys/log.key" --log-origin "$o" --log-witness-policy "$work/witnesses.policy" --no-chain-checkpoints)
      worker_flags=(--no-chain-checkpoints)
      start sink,control,log
    else
      dev_flags=() worker_flags=()
      start sink,control
    fi
    abrun "$side" "$round"
    if [ "$side" = on ]; then
      sleep 3 # the last records' witnessed checkpoint
      echo "          the log then: $(sed -n 2p "$work/dev/tlog/checkpoint") entries under a checkpoint with $(grep -c '^— ' "$work/dev/tlog/checkpoint") signatures"
    fi
    stop_all
  done
done
