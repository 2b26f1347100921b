#!/usr/bin/env bash
# The Redis protocol next to gRPC on the same cluster (issue 14, bar 2): a release
# playground (3 nodes, one group), then RUNS rounds of
#   redis-benchmark -t set,get -n 200000 -r 100000 -c 50 -d 16 -q   (16-byte values)
# against the group leader's Redis port, then against a follower's (whose commands the
# node passes on to the leader), and `phoenix bench cluster` at 50 clients, 16-byte keys,
# 16-byte values (the bench's least) over 100,000 keys (writes, then reads), 10 s each,
# against the same nodes (in the reverse order every other round). Then, if etcd is on the PATH, the same bench against a spawned
# 3-node etcd cluster, RUNS rounds. Prints each round and the medians.
#
#   crates/cli/scripts/resp-vs-grpc.sh OUT_DIR        (RUNS=3, PHOENIX_BIN=target/release/phoenix)
set -euo pipefail
out=${1:?usage: resp-vs-grpc.sh OUT_DIR}
runs=${RUNS:-3}
bin=${PHOENIX_BIN:-target/release/phoenix}
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (redis-tools)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
set -m
# One group, as the bar is stated: without `--split-qps 0` the load of the first round
# splits the group, and later rounds (and MSET's keys) span several.
"$bin" playground --data-dir "$out/data" --base-port 0 --output json --server-arg=--split-qps=0 >"$out/playground.json" 2>"$out/playground.err" </dev/null &
pg=$!
set +m
trap 'kill -TERM -- "-$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true' EXIT
for _ in $(seq 1 180); do
  grep -q '"endpoints"' "$out/playground.json" && break
  sleep 0.5
done
endpoints=$(sed -n 's/.*"endpoints":"\([^"]*\)".*/\1/p' "$out/playground.json")
resp_of() { grep -o "\"node_id\":$1,\"resp\":\"127.0.0.1:[0-9]*\"" "$out/playground.json" | sed 's/.*://; s/"//'; }
# The group's leader as the cluster reports it now (the replicas' own word), and the
# Redis ports of it and of a follower: asked before every round, as leadership may move.
find_ports() {
  leader=$("$bin" --output json cluster status --endpoints "$endpoints" |
    sed -n 's/.*"group_id":1,"leader":\([0-9]*\).*/\1/p')
  port=$(resp_of "$leader")
  follower=$(grep -o '"node_id":[0-9]*' "$out/playground.json" | sed 's/.*://' | grep -vx "$leader" | head -1)
  fport=$(resp_of "$follower")
  [ -n "$endpoints" ] && [ -n "$port" ] && [ -n "$fport" ] || { echo "playground not up" >&2; exit 1; }
  echo "endpoints $endpoints; Redis port $port (node $leader, the leader), $fport (node $follower, a follower)"
}
redis_round() { # PORT FILE
  redis-benchmark -p "$1" -t set,get -n 200000 -r 100000 -c 50 -d 16 -q 2>/dev/null | tr '\r' '\n' |
    sed -n 's/^\(SET\|GET\): \([0-9.]*\) requests per second.*/\1 \2/p' >"$2"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
grpc_round() { # ROUND
  for ratio in 0 1; do
    "$bin" --output json bench cluster --endpoints "$endpoints" --clients 50 --duration 10 \
      --key_size 16 --value_size 16 --keys 100000 --read_ratio "$ratio" >"$out/grpc-$1-$ratio.json" 2>/dev/null
  done
}
for i in $(seq 1 "$runs"); do
  find_ports
  # The order turns round every round, so what the cluster does in the background
  # (flushes, compactions) weighs on no one path more than on another.
  if [ $((i % 2)) = 1 ]; then
    redis_round "$port" "$out/redis-$i.txt"
    redis_round "$fport" "$out/redis-follower-$i.txt"
    grpc_round "$i"
  else
    grpc_round "$i"
    redis_round "$fport" "$out/redis-follower-$i.txt"
    redis_round "$port" "$out/redis-$i.txt"
  fi
  rs=$(awk '$1=="SET"{print $2}' "$out/redis-$i.txt"); rg=$(awk '$1=="GET"{print $2}' "$out/redis-$i.txt")
  gs=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/grpc-$i-0.json" | head -1)
  gg=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/grpc-$i-1.json" | head -1)
  fs=$(awk '$1=="SET"{print $2}' "$out/redis-follower-$i.txt"); fg=$(awk '$1=="GET"{print $2}' "$out/redis-follower-$i.txt")
  echo "round $i: redis at the leader SET $rs GET $rg; at a follower SET $fs GET $fg; gRPC writes $gs reads $gg" |
    tee -a "$out/rounds.txt"
  echo "$rs $rg $gs $gg $fs $fg" >>"$out/figures.txt"
done
col() { awk -v c="$1" '{print $c}' "$out/figures.txt" | median; }
ms=$(col 1); mg=$(col 2); gs=$(col 3); gg=$(col 4); fs=$(col 5); fg=$(col 6)
awk -v ms="$ms" -v mg="$mg" -v gs="$gs" -v gg="$gg" -v fs="$fs" -v fg="$fg" 'BEGIN {
  printf "medians: SET %.0f/s over RESP at the leader, %.0f/s at a follower, vs %.0f/s over gRPC (%.2fx, %.2fx)\n",
    ms, fs, gs, ms / gs, fs / gs
  printf "         GET %.0f/s over RESP at the leader, %.0f/s at a follower, vs %.0f/s over gRPC (%.2fx, %.2fx)\n",
    mg, fg, gg, mg / gg, fg / gg }' | tee -a "$out/rounds.txt"
kill -TERM -- "-$pg" 2>/dev/null || true
wait "$pg" 2>/dev/null || true
trap - EXIT
if command -v etcd >/dev/null; then
  for i in $(seq 1 "$runs"); do
    for ratio in 0 1; do
      "$bin" --output json bench cluster --spawn "$out/etcd" --target etcd --clients 50 --duration 10 \
        --key_size 16 --value_size 16 --keys 100000 --read_ratio "$ratio" >"$out/etcd-$i-$ratio.json" 2>/dev/null
    done
    es=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/etcd-$i-0.json" | head -1)
    eg=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out/etcd-$i-1.json" | head -1)
    echo "etcd round $i: writes $es reads $eg" | tee -a "$out/rounds.txt"
    echo "$es $eg" >>"$out/etcd.txt"
  done
  es=$(awk '{print $1}' "$out/etcd.txt" | median); eg=$(awk '{print $2}' "$out/etcd.txt" | median)
  echo "etcd medians: writes $es/s, reads $eg/s" | tee -a "$out/rounds.txt"
else
  echo "etcd not on the PATH: its figures are not taken" | tee -a "$out/rounds.txt"
fi
