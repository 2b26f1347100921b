#!/usr/bin/env bash
# Runs `phoenix bench engine` and RocksDB's `db_bench` side by side with identical flags
# over the cells of docs/bench-engine.md (100/256 B values, 1/4 threads, WAL on without
# sync / WAL off), REPS times, interleaved (PhoenixKV then db_bench for each cell).
# Every cell has a 1M-key space (`--num` is per thread and also the key space, so
# 4 threads write 4M records over 1M keys) and 1M reads in all (`--reads` is per thread).
# Raw output goes to stdout with a "## cell" header per run; summarize with
# crates/engine/scripts/summarize-vs-rocksdb.py.
#
# usage: bench-vs-rocksdb.sh PHOENIX_BINARY [REPS] [DBDIR] > out
set -euo pipefail
BIN=${1:?path to the phoenix binary}
REPS=${2:-3}
DIR=${3:-/work/bench}
DB_BENCH=${DB_BENCH:-db_bench}
mkdir -p "$DIR"
COMMON="--benchmarks=fillseq,fillrandom,overwrite,readrandom,readseq,seekrandom \
--key_size=16 --sync=0 --bloom_bits=10 --cache_size=8388608 \
--write_buffer_size=67108864 --compression_type=none"
for rep in $(seq 1 "$REPS"); do
  for vs in 100 256; do
    for th in 1 4; do
      for wal in 0 1; do
        sizes="--num=1000000 --reads=$((1000000 / th))"
        flags="$COMMON $sizes --threads=$th --value_size=$vs --disable_wal=$wal"
        for sys in phoenix rocksdb; do
          rm -rf "$DIR/pdb" "$DIR/rdb"
          sync
          echo "## rep=$rep value=$vs threads=$th disable_wal=$wal system=$sys"
          if [ "$sys" = phoenix ]; then
            "$BIN" bench engine $flags --db="$DIR/pdb" 2>&1 | grep -E '^[a-z]+ +:'
          else
            "$DB_BENCH" $flags --db="$DIR/rdb" 2>&1 | grep -E '^[a-z]+ +:'
          fi
        done
      done
    done
  done
done
rm -rf "$DIR/pdb" "$DIR/rdb"
