#!/usr/bin/env bash
# Cost of a split (issue "Groups that move, split, merge and repair themselves"): a
# 3-node loopback cluster with one group (no split by size or load), filled with KEYS keys of
# VALUE bytes (hashed layout: the first key byte is uniform), then a write load with
# --verify runs while the group is split at key byte 0x80 (about half of it moves).
# Prints the split's time (the `cluster split` call: plan, apply on every replica,
# routing table), the nodes' engine bytes before and after, and the load's summary
# (p99 latency, errors; every acknowledged write read back at the end). A second load
# run without a split is printed first, for comparison.
#
# Usage: crates/cli/scripts/split.sh [OUT_DIR]
# Settings (environment): KEYS (200000), VALUE (512), LOAD_S (20), SPLIT_AFTER_S (5),
# SERVER_ARGS, PHOENIX_BIN.
# Needs: a release build (cargo build --release -p phoenix-cli), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-split}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
keys=${KEYS:-200000}
value=${VALUE:-512}
load_s=${LOAD_S:-20}
split_after=${SPLIT_AFTER_S:-5}
rm -rf "$out"; mkdir -p "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addrs=()
for i in 1 2 3; do addrs+=("127.0.0.1:$(free_port)"); done
meta="1@${addrs[0]},2@${addrs[1]},3@${addrs[2]}"
endpoints=$(IFS=,; echo "${addrs[*]}")
pids=()
stop_all() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap stop_all EXIT
for i in 1 2 3; do
  "$phoenix" server --id "$i" --listen "${addrs[$((i - 1))]}" --data-dir "$out/node-$i" \
    --meta "$meta" --split-size-mb 0 --split-size-keys 0 --split-qps 0 ${SERVER_ARGS:-} \
    2>"$out/node-$i.log" &
  pids+=($!)
done
status() { "$phoenix" cluster status --endpoints "$endpoints" --output json 2>/dev/null; }
for _ in $(seq 1 120); do
  led=$(status | jq '[.groups[] | select(.leader != null and .leader != 0)] | length' 2>/dev/null || echo 0)
  [ "$led" -ge 1 ] && break
  sleep 0.5
done
# load OPS [FLAGS]: OPS writes (or --duration) by 16 clients, every one verified.
load() {
  local ops=$1; shift
  "$phoenix" bench cluster --endpoints "$endpoints" --clients 16 --keys "$keys" \
    --key_size 16 --value_size "$value" --key-layout hashed --ops "$ops" \
    --duration "$load_s" --verify "$@"
}
load 1 --fill >"$out/fill.txt" 2>&1
engine() { status | jq '[.nodes[].engine_bytes] | add'; }
echo "filled $keys keys of $value bytes; engine bytes (3 nodes): $(engine)"
load 100000000 >"$out/load-nosplit.txt" 2>&1
echo "load without a split: $(grep -E '^\| phoenix ' "$out/load-nosplit.txt" | tail -1)"
load 100000000 >"$out/load-split.txt" 2>&1 &
lp=$!
sleep "$split_after"
before=$(engine)
t0=$(date +%s.%N)
"$phoenix" cluster split --endpoints "$endpoints" --hex 1 80 --wait-ms 60000
t1=$(date +%s.%N)
echo "split took $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}') s; engine bytes before $before"
wait "$lp"
echo "load with the split: $(grep -E '^\| phoenix ' "$out/load-split.txt" | tail -1)"
grep -iE "verif|error" "$out/load-split.txt" | tail -3 || true
echo "engine bytes after: $(engine)"
grep -h "split applied" "$out"/node-*.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160
