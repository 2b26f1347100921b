#!/usr/bin/env bash
# The seed 003 experiment: 25, 50, 100 streams written concurrently (one writer each),
# queues swept 1..32; then a run that resizes the queues midway and verifies every stream.
# Usage: bench-queues.sh <phoenix binary> [out dir]
set -euo pipefail
PHX=${1:?path to the phoenix binary}
TMP=${2:-/work/bench-tmp}
mkdir -p "$TMP"
for streams in 25 50 100; do
  num=$((40000 / streams))
  for q in 1 2 4 8 16 32; do
    printf "streams=%-4s queues=%-3s " "$streams" "$q"
    "$PHX" bench log --dir "$TMP/phoenix-log" --streams "$streams" --writers "$streams" --segment_mb 8 \
      --queues "$q" --value_size 128 --num "$num" --sync true | grep -E "logappend" | sed 's/logappend *: *//'
  done
done
echo "## resize during a run"
"$PHX" bench log --dir "$TMP/phoenix-log" --streams 50 --writers 50 --queues 2 --resize_to 8 \
  --value_size 128 --num 800 --sync true --verify | grep -E "resized|logappend|verify"
"$PHX" bench log --dir "$TMP/phoenix-log" --streams 50 --writers 50 --queues 8 --resize_to 1 \
  --value_size 128 --num 800 --sync true --verify | grep -E "resized|logappend|verify"
rm -rf "$TMP/phoenix-log"
