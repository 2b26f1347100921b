#!/usr/bin/env bash
# Listings side by side with db_bench: `seekrandom` with --seek_nexts, plain, bounded
# (--max_scan_distance) and prefix (--prefix_size with --prefix_same_as_start), for each
# value size and thread count, PhoenixKV and RocksDB interleaved, REPS repetitions.
# Raw db_bench-style lines go to OUT, each tagged; summarize with seek-matrix.py OUT.
#
#   PHOENIX_BIN=target/release/phoenix crates/engine/scripts/seek-matrix.sh OUT
#
# Settings (environment): REPS (3), VALUES ("32 100 256"), THREADS ("1 4 8"),
# NEXTS ("0 10 100"), VARIANTS ("plain bounded prefix"), NUM (1000000), DIR (/tmp).
set -euo pipefail
out=${1:?usage: seek-matrix.sh OUT}
bin=${PHOENIX_BIN:-target/release/phoenix}
reps=${REPS:-3}
num=${NUM:-1000000}
dir=${DIR:-/tmp}
command -v db_bench >/dev/null || { echo "db_bench not found (apt install rocksdb-tools)" >&2; exit 1; }
: >"$out"
common="--num=$num --key_size=16 --bloom_bits=10 --compression_type=none --cache_size=8388608"
# The prefix variant: keys start with their prefix number (8 bytes), 100 keys a prefix.
prefix_keys="--prefix_size=8 --keys_per_prefix=100 --memtable_bloom_size_ratio=0.1"

run() { # tag engine args...
  local tag=$1 engine=$2; shift 2
  local line
  if [ "$engine" = phoenix ]; then
    line=$("$bin" bench engine "$@" 2>&1 | grep -E '^(fillrandom|seekrandom) ' || true)
  else
    line=$(db_bench "$@" 2>&1 | grep -E '^(fillrandom|seekrandom) ' || true)
  fi
  [ -n "$line" ] || { echo "$tag $engine: no result line" >&2; exit 1; }
  echo "$tag $engine $line" | tee -a "$out"
}

for v in ${VALUES:-32 100 256}; do
  pk=$dir/seekm-pk-$v; rk=$dir/seekm-rdb-$v
  pkp=$dir/seekm-pkp-$v; rkp=$dir/seekm-rdbp-$v
  rm -rf "$pk" "$rk" "$pkp" "$rkp"
  # Filled, then compacted down (db_bench's `compact`), so both engines read the same LSM
  # shape: left alone, which one's background compaction happened to finish before the
  # reads would decide how many sources a seek visits.
  run "fill v=$v variant=plain" phoenix --benchmarks=fillrandom,compact $common --value_size=$v --db="$pk"
  run "fill v=$v variant=plain" rocksdb --benchmarks=fillrandom,compact $common --value_size=$v --db="$rk"
  case " ${VARIANTS:-plain bounded prefix} " in *" prefix "*)
    run "fill v=$v variant=prefix" phoenix --benchmarks=fillrandom,compact $common $prefix_keys --key_layout=db_bench --value_size=$v --db="$pkp"
    run "fill v=$v variant=prefix" rocksdb --benchmarks=fillrandom,compact $common $prefix_keys --value_size=$v --db="$rkp"
  esac
  for t in ${THREADS:-1 4 8}; do
    for n in ${NEXTS:-0 10 100}; do
      # About a second a run at one thread on the machine of BENCHMARKS.md.
      case $n in 0) base=300000 ;; 10) base=200000 ;; *) base=60000 ;; esac
      div=$(( t > 2 ? t / 2 : 1 )); reads=$(( base / div ))
      for variant in ${VARIANTS:-plain bounded prefix}; do
        case $variant in
          plain) extra=""; p=$pk; r=$rk; pextra="" ;;
          bounded) extra="--max_scan_distance=50"; p=$pk; r=$rk; pextra="" ;;
          prefix) extra="$prefix_keys --prefix_same_as_start=true"; p=$pkp; r=$rkp; pextra="--key_layout=db_bench" ;;
        esac
        for rep in $(seq 1 "$reps"); do
          tag="seek v=$v t=$t n=$n variant=$variant rep=$rep"
          run "$tag" phoenix --benchmarks=seekrandom $common $extra $pextra --value_size=$v --threads=$t \
            --use_existing_db --reads=$reads --seek_nexts=$n --db="$p"
          run "$tag" rocksdb --benchmarks=seekrandom $common $extra --value_size=$v --threads=$t \
            --use_existing_db=1 --reads=$reads --seek_nexts=$n --db="$r"
        done
      done
    done
  done
  rm -rf "$pk" "$rk" "$pkp" "$rkp"
done
