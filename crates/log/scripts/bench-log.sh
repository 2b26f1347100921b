#!/usr/bin/env bash
# Runs the log store benchmarks of docs/bench-log.md side by side with RocksDB's db_bench
# and the naive append+fdatasync baseline. Usage: bench-log.sh <phoenix binary> [out dir]
set -euo pipefail
PHX=${1:?path to the phoenix binary}
TMP=${2:-/work/bench-tmp}
mkdir -p "$TMP"

echo "## durable appends: phoenix log vs db_bench fillrandom --sync=1 vs naive"
for writers in 16 64; do
  num=$((32000 / writers))
  naive_num=$((3200 / writers))
  for vs in 16 128 1024 16384; do
    echo "### writers=$writers value_size=$vs"
    "$PHX" bench log --dir "$TMP/phoenix-log" --streams "$writers" --queues 1 \
      --writers "$writers" --value_size "$vs" --num "$num" --sync true | grep -E "logappend|latency|store"
    "$PHX" bench log --dir "$TMP/phoenix-log" --streams "$writers" --queues 4 \
      --writers "$writers" --value_size "$vs" --num "$num" --sync true | grep -E "logappend|latency|store" | sed 's/^/q4 /'
    rm -rf "$TMP/rocks"
    db_bench --benchmarks=fillrandom --sync=1 --disable_wal=0 --num="$num" --threads="$writers" \
      --value_size="$vs" --key_size=16 --compression_type=none --db="$TMP/rocks" 2>&1 | grep -E "^fillrandom"
    "$PHX" bench log --dir "$TMP/phoenix-log" --naive --writers "$writers" --value_size "$vs" \
      --num "$naive_num" --sync true | grep -E "naive|latency"
  done
done
rm -rf "$TMP/rocks" "$TMP/phoenix-log"
