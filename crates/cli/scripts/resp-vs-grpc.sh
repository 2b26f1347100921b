#!/usr/bin/env bash
# The Redis protocol next to gRPC on the same cluster (issue 14, bar 2): a release
# playground (3 nodes, one group), then RUNS rounds of
#   redis-benchmark -t set,get -n 200000 -r 100000 -c 50 -d 16 -q   (16-byte values)
# against one node's Redis port (the last the playground lists), and `phoenix bench cluster` at 50 clients, 16-byte keys,
# 16-byte values (the bench's least) over 100,000 keys (writes, then reads), 10 s each, against the same
# nodes. Prints each round and the medians.
#
#   crates/cli/scripts/resp-vs-grpc.sh OUT_DIR        (RUNS=3, PHOENIX_BIN=target/release/phoenix)
set -euo pipefail
out=${1:?usage: resp-vs-grpc.sh OUT_DIR}
runs=${RUNS:-3}
bin=${PHOENIX_BIN:-target/release/phoenix}
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (redis-tools)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
set -m
"$bin" playground --data-dir "$out/data" --base-port 0 --output json >"$out/playground.json" 2>"$out/playground.err" </dev/null &
pg=$!
set +m
trap 'kill -TERM -- "-$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true' EXIT
for _ in $(seq 1 180); do
  grep -q '"endpoints"' "$out/playground.json" && break
  sleep 0.5
done
endpoints=$(sed -n 's/.*"endpoints":"\([^"]*\)".*/\1/p' "$out/playground.json")
port=$(sed -n 's/.*"resp":"127.0.0.1:\([0-9]*\)".*/\1/p' "$out/playground.json")
[ -n "$endpoints" ] && [ -n "$port" ] || { echo "playground not up" >&2; exit 1; }
echo "endpoints $endpoints, Redis port $port (the last node's)"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for i in $(seq 1 "$runs"); do
  redis-benchmark -p "$port" -t set,get -n 200000 -r 100000 -c 50 -d 16 -q 2>/dev/null | tr '\r' '\n' |
    sed -n 's/^\(SET\|GET\): \([0-9.]*\) requests per second.*/\1 \2/p' >"$out/redis-$i.txt"
  for ratio in 0 1; do
    "$bin" --output json bench cluster --endpoints "$endpoints" --clients 50 --duration 10 \
      --key_size 16 --value_size 16 --keys 100000 --read_ratio "$ratio" >"$out/grpc-$i-$ratio.json" 2>/dev/null
  done
  rs=$(awk '$1=="SET"{print $2}' "$out/redis-$i.txt"); rg=$(awk '$1=="GET"{print $2}' "$out/redis-$i.txt")
  gs=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/grpc-$i-0.json" | head -1)
  gg=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/grpc-$i-1.json" | head -1)
  echo "round $i: redis SET $rs GET $rg; gRPC writes $gs reads $gg" | tee -a "$out/rounds.txt"
  echo "$rs $rg $gs $gg" >>"$out/figures.txt"
done
ms=$(awk '{print $1}' "$out/figures.txt" | median); mg=$(awk '{print $2}' "$out/figures.txt" | median)
gs=$(awk '{print $3}' "$out/figures.txt" | median); gg=$(awk '{print $4}' "$out/figures.txt" | median)
awk -v ms="$ms" -v mg="$mg" -v gs="$gs" -v gg="$gg" 'BEGIN {
  printf "medians: SET %.0f/s over RESP vs %.0f/s over gRPC (%.2fx); GET %.0f/s vs %.0f/s (%.2fx)\n",
    ms, gs, ms / gs, mg, gg, mg / gg }' | tee -a "$out/rounds.txt"
