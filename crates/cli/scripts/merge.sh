#!/usr/bin/env bash
# Cost of a merge (issue "Groups that move, split, merge and repair themselves"): a
# 3-node loopback cluster with one group (no split or merge by size or load), filled
# with KEYS keys of VALUE bytes (hashed layout: the first key byte is uniform) and split
# at key byte 0x80, then a write load with --verify runs while the upper group is merged
# back into the lower one (about half the data is copied on every replica). Prints the
# merge's time (the `cluster merge` call: plan, prepare on every source replica and its
# flush, commit on every target replica, routing table), and the load's summary (p99
# latency, errors; every acknowledged write read back at the end). A load run without a
# merge, on the two groups, is printed first, for comparison.
#
# Usage: crates/cli/scripts/merge.sh [OUT_DIR]
# Settings (environment): KEYS (60000: about 16 MB per replica to copy, under the
# 20 MiB merge size), VALUE (512), LOAD_S (20), MERGE_AFTER_S (5), SERVER_ARGS,
# PHOENIX_BIN.
# Needs: a release build (cargo build --release -p phoenix-cli), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-merge}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
keys=${KEYS:-60000}
value=${VALUE:-512}
load_s=${LOAD_S:-20}
merge_after=${MERGE_AFTER_S:-5}
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
    --meta "$meta" --split-size-mb 0 --split-size-keys 0 --split-qps 0 --merge-size-mb 0 ${SERVER_ARGS:-} \
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
"$phoenix" cluster split --endpoints "$endpoints" --hex 1 80 --wait-ms 60000
for _ in $(seq 1 120); do
  led=$(status | jq '[.groups[] | select(.leader != null and .leader != 0)] | length' 2>/dev/null || echo 0)
  [ "$led" -ge 2 ] && break
  sleep 0.5
done
load 100000000 >"$out/load-nomerge.txt" 2>&1
echo "load without a merge (two groups): $(grep -E '^\| phoenix ' "$out/load-nomerge.txt" | tail -1)"
load 100000000 >"$out/load-merge.txt" 2>&1 &
lp=$!
sleep "$merge_after"
t0=$(date +%s.%N)
"$phoenix" cluster merge --endpoints "$endpoints" 2 1 --wait-ms 60000
t1=$(date +%s.%N)
echo "merge took $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}') s"
wait "$lp"
echo "load with the merge: $(grep -E '^\| phoenix ' "$out/load-merge.txt" | tail -1)"
grep -iE "verif|error" "$out/load-merge.txt" | tail -3 || true
echo "groups after: $(status | jq '.groups | length')"
grep -h "merge applied\|frozen for a merge" "$out"/node-*.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160
