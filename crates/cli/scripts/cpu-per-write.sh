#!/usr/bin/env bash
# CPU time per write by thread kind, servers and bench client together: where a write's
# cost goes (the raft driver, the gRPC threads, the log store's queue writer, the bench's
# own client). A 3-node loopback cluster bootstrapped with N groups; 64 clients write for
# 20 s with keys spread over every group (`--key-layout hashed`); the threads' utime +
# stime from /proc are sampled 5 s and 15 s into the run.
#
# Usage: crates/cli/scripts/cpu-per-write.sh [N] [OUT_DIR]   (default N: 1)
# PHOENIX_BIN runs that binary instead of target/release/phoenix. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
n=${1:-1}
out=${2:-/tmp/phoenix-cpu-per-write}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
ticks=$(getconf CLK_TCK)
rm -rf "$out"; mkdir -p "$out"
set -m
"$phoenix" playground --data-dir "$out/data" --base-port 0 --output json --ready-timeout 600 \
  --server-arg=--initial-groups="$n" --server-arg=--merge-size-mb=0 >"$out/out" 2>"$out/err" </dev/null &
pg=$!
set +m
trap 'kill -INT $pg 2>/dev/null || true; sleep 2; kill -KILL -- -$pg 2>/dev/null || true' EXIT
endpoints=""
while [ -z "$endpoints" ]; do
  kill -0 "$pg" 2>/dev/null || { cat "$out/err" >&2; exit 1; }
  sleep 1
  endpoints=$(sed -n 's/.*"endpoints":"\([^"]*\)".*/\1/p' "$out/out")
done
sleep 20 # the groups settle (and sleep)
# utime + stime summed by thread name over the servers and the bench client.
sample() {
  for p in $(pgrep -P "$pg" -f ' server ') $(pgrep -f ' bench cluster --endpoints '"$endpoints"); do
    for t in /proc/"$p"/task/*; do
      echo "$(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat" 2>/dev/null || echo 0)"
    done
  done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
"$phoenix" bench cluster --endpoints "$endpoints" --clients 64 --ops 1000000000 --duration 20 \
  --key_size 16 --value_size 128 --keys 1000000 --key-layout hashed >"$out/bench.txt" 2>&1 &
bench=$!
sleep 5; sample >"$out/s1"; sleep 10; sample >"$out/s2"
wait "$bench"
ops=$(awk -F'|' '/^\| phoenix /{gsub(/ /, "", $4); print $4}' "$out/bench.txt" | tail -1)
echo "N=$n: $ops writes/s"
join "$out/s1" "$out/s2" | awk -v ops="$ops" -v t="$ticks" '
  { s = ($3 - $2) / t; total += s
    if (s > 0.05) printf "  %-18s %6.2f CPU-s in 10 s  %6.1f µs per write\n", $1, s, 1e6 * s / (ops * 10) }
  END { printf "  %-18s %6.2f CPU-s in 10 s  %6.1f µs per write\n", "all", total, 1e6 * total / (ops * 10) }'
