#!/usr/bin/env bash
# Repeats the durable-append comparison (phoenix log with 1 and 4 queues, db_bench
# fillrandom --sync=1) REPS times, interleaved, so that the median of each cell is taken
# over the same stretch of time on a shared machine. Usage: bench-log-repeat.sh <phoenix> [reps]
set -euo pipefail
PHX=${1:?path to the phoenix binary}
REPS=${2:-3}
TMP=${TMP:-/work/bench-tmp}
mkdir -p "$TMP"
for rep in $(seq 1 "$REPS"); do
  for writers in 16 64; do
    num=$((32000 / writers))
    for vs in 16 128 1024 16384; do
      for q in 1 4; do
        r=$("$PHX" bench log --dir "$TMP/phoenix-log" --streams "$writers" --queues "$q" \
          --writers "$writers" --value_size "$vs" --num "$num" --sync true | awk '/logappend/ {print $5}')
        echo "rep=$rep writers=$writers value_size=$vs system=phoenix-q$q ops_per_sec=$r"
      done
      rm -rf "$TMP/rocks"
      r=$(db_bench --benchmarks=fillrandom --sync=1 --disable_wal=0 --num="$num" --threads="$writers" \
        --value_size="$vs" --key_size=16 --compression_type=none --db="$TMP/rocks" 2>&1 \
        | awk '/^fillrandom/ {print $5}')
      echo "rep=$rep writers=$writers value_size=$vs system=rocksdb ops_per_sec=$r"
    done
  done
done
rm -rf "$TMP/rocks" "$TMP/phoenix-log"
