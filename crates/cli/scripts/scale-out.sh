#!/usr/bin/env bash
# Scale-out under load (issue "Groups that move, split, merge and repair themselves",
# bar 5): a 3-node loopback cluster bootstrapped with NGROUPS groups takes a steady
# write load (`phoenix bench cluster`, CLIENTS clients, DURATION s); after WARMUP s three
# more nodes start. Prints how long until replicas and leaders are balanced (every node
# within 10% of the mean, or one, and no operator under way) and the bench's summary
# (errors and unknown outcomes reaching clients, latency percentiles over the run).
#
# Usage: crates/cli/scripts/scale-out.sh [OUT_DIR]
# Settings (environment): NGROUPS (64), CLIENTS (16), DURATION (120), WARMUP (15),
# VALUE (256), SERVER_ARGS, PHOENIX_BIN.
# Needs: a release build (cargo build --release -p phoenix-cli), jq, python3. Nothing
# else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-scale-out}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
groups=${NGROUPS:-64}
clients=${CLIENTS:-16}
duration=${DURATION:-120}
warmup=${WARMUP:-15}
value=${VALUE:-256}
rm -rf "$out"; mkdir -p "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addrs=()
for i in 1 2 3 4 5 6; do addrs+=("127.0.0.1:$(free_port)"); done
meta="1@${addrs[0]},2@${addrs[1]},3@${addrs[2]}"
endpoints="${addrs[0]},${addrs[1]},${addrs[2]}"
pids=()
stop_all() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap stop_all EXIT
start_node() {
  local i=$1
  "$phoenix" server --id "$i" --listen "${addrs[$((i - 1))]}" --data-dir "$out/node-$i" \
    --meta "$meta" --initial-groups "$groups" --merge-size-mb 0 ${SERVER_ARGS:-} 2>"$out/node-$i.log" &
  pids+=($!)
}
for i in 1 2 3; do start_node "$i"; done

status() { "$phoenix" cluster status --endpoints "$endpoints" --output json 2>/dev/null; }
for _ in $(seq 1 300); do
  led=$(status | jq '[.groups[] | select(.leader != null and .leader != 0)] | length' 2>/dev/null || echo 0)
  [ "$led" -ge "$groups" ] && break
  sleep 1
done
echo "3 nodes up: $led of $groups groups led"
"$phoenix" bench cluster --endpoints "$endpoints" --clients "$clients" --ops 1000000000 \
  --duration "$duration" --key_size 16 --value_size "$value" --keys 1000000 \
  --key-layout hashed >"$out/bench.txt" 2>"$out/bench.err" &
bench=$!
sleep "$warmup"
for i in 4 5 6; do start_node "$i"; done
t0=$(date +%s.%N)
echo "nodes 4-6 started ${warmup} s into the load"
# Balanced: replicas and leaders per node within max(10% of the mean, 1) of the mean
# over the six nodes, and no operator under way.
balanced='
  def band(xs): (xs | add / length) as $m | ([$m / 10, 1] | max) as $s
    | (xs | max) <= $m + $s and (xs | min) >= $m - $s;
  ([.groups[].replicas[]] | group_by(.) | map(length)) as $r
  | ([.groups[].leader] | group_by(.) | map(length)) as $l
  | ($r | length) == 6 and ($l | length) == 6 and band($r) and band($l)
    and (.operators | length) == 0'
done_at=""
while kill -0 "$bench" 2>/dev/null; do
  s=$(status) || { sleep 0.5; continue; }
  el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  if [ -z "$done_at" ] && [ "$(jq "$balanced" <<<"$s")" = true ]; then
    done_at=$el
    echo "t=${el}s balanced: replicas $(jq -c '[.groups[].replicas[]] | group_by(.) | map(length)' <<<"$s"), leaders $(jq -c '[.groups[].leader] | group_by(.) | map(length)' <<<"$s")"
  fi
  sleep 0.5
done
wait "$bench" || true
echo "bench (whole run, ${duration} s, nodes added at ${warmup} s):"
grep -E '^   ' "$out/bench.txt" || cat "$out/bench.err"
# Worst second after the nodes were added (p99, throughput) next to the mean second
# before. A line reads "[  12s]  5681 ops/s  p50  10625 us  p99  24953 us  failed …".
awk -v w="$warmup" '/^\[ *[0-9]+s\]/ {
    t = $2; sub(/s\]/, "", t); t += 0; ops = $3; p99 = $9
    if (t <= w) { sum += ops; nb++ } else { if (p99 > worst) worst = p99; if (min == "" || ops < min) min = ops }
  } END {
    printf "before: mean %d ops/s; after the nodes joined: worst second p99 %d us, slowest second %d ops/s\n", nb ? sum / nb : 0, worst, min
  }' "$out/bench.txt"
echo "RESULT groups=$groups clients=$clients balanced_after_s=${done_at:-never}"
