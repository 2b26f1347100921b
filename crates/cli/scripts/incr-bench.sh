#!/usr/bin/env bash
# INCR over the Redis protocol, one binary next to another (issue "Ready for real
# users": INCR as one replicated command, against the compare-and-swap loop it
# replaces). Per round and per binary (the order turned every round): a release
# playground (3 nodes, one group), then against the group leader's Redis port
#   redis-benchmark -t incr -n 100000 -r 100000 -c 50 -q   (keys spread: little contention)
#   redis-benchmark -t incr -n 50000 -c 50 -q              (one hot counter for all 50)
# and the playground is stopped. Prints each round and the medians.
#
#   crates/cli/scripts/incr-bench.sh OUT_DIR OLD_BIN NEW_BIN     (RUNS=3)
set -euo pipefail
out=${1:?usage: incr-bench.sh OUT_DIR OLD_BIN NEW_BIN}
old=${2:?old binary}
new=${3:?new binary}
runs=${RUNS:-3}
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (redis-tools)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
one() { # BIN NAME ROUND
  local d="$out/$2-$3"
  mkdir -p "$d"
  set -m
  "$1" playground --data-dir "$d/data" --base-port 0 --output json >"$d/playground.json" 2>"$d/playground.err" </dev/null &
  local pg=$!
  set +m
  for _ in $(seq 1 180); do
    grep -q '"endpoints"' "$d/playground.json" && break
    sleep 0.5
  done
  local leader port
  leader=$(sed -n 's/.*"groups":\[{"group_id":1,"leader":\([0-9]*\).*/\1/p' "$d/playground.json")
  port=$(grep -o "\"node_id\":$leader,\"resp\":\"127.0.0.1:[0-9]*\"" "$d/playground.json" | sed 's/.*://; s/"//')
  [ -n "$port" ] || { echo "playground of $2 not up" >&2; kill -TERM -- "-$pg"; exit 1; }
  # (Until the nodes have heard each other's levels, increments take the fallback.)
  sleep 3
  # A run that meets an error reply stops (redis-benchmark's way): counted as 0/s,
  # and its first error is kept.
  rate() { # FILE
    local r
    r=$(tr '\r' '\n' <"$1" | sed -n 's/^INCR: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
    echo "${r:-0}"
  }
  redis-benchmark -p "$port" -t incr -n 100000 -r 100000 -c 50 -q >"$d/spread.txt" 2>&1 || true
  redis-benchmark -p "$port" -t incr -n 50000 -c 50 -q >"$d/hot.txt" 2>&1 || true
  local err
  err=$(grep -h -m1 -o 'Error from server: .*' "$d/spread.txt" "$d/hot.txt" | head -1 || true)
  echo "$2 $3 spread $(rate "$d/spread.txt") hot $(rate "$d/hot.txt") ${err:+($err)}" | tee -a "$out/rounds.txt"
  kill -TERM -- "-$pg" 2>/dev/null || true
  wait "$pg" 2>/dev/null || true
}
for i in $(seq 1 "$runs"); do
  if [ $((i % 2)) = 1 ]; then
    one "$old" old "$i"; one "$new" new "$i"
  else
    one "$new" new "$i"; one "$old" old "$i"
  fi
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for b in old new; do
  s=$(awk -v b=$b '$1==b{print $4}' "$out/rounds.txt" | median)
  h=$(awk -v b=$b '$1==b{print $6}' "$out/rounds.txt" | median)
  echo "median $b: spread $s/s, hot counter $h/s"
done
