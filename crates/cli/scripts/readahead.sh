#!/usr/bin/env bash
# Readahead on an object store (issue "Data on shared storage", bar 3's iterators):
# `phoenix bench engine` with its tables on MinIO on loopback with LATENCY_MS added to
# every request, readahead on (the engine's defaults: iterators up to 256 KiB, compactions
# 2 MiB per request) and off (`--readahead_max 0 --compaction_readahead_size 0`), the two
# in turn, the order swapped every run. Per run and setting: a fresh fillrandom of NUM
# entries (16-byte keys, 100-byte values; its background compactions read as the setting
# says), `compact` (every file compacted down, timed), then on that database readseq
# (SCAN entries from the first key, 1 thread) and seekrandom with 1,000 nexts (SEEKS per
# thread, at 1 and 8 threads). No block cache fill for the scans (`--cache_size 0`), so
# each run reads from the store. The table printed at the end holds the medians of RUNS.
#
# Usage: crates/cli/scripts/readahead.sh [OUT_DIR]
# NUM (default 500000), RUNS (default 3), LATENCY_MS (default 1), SCAN (default 200000),
# SEEKS (default 50). PHOENIX_BIN runs that binary instead of target/release/phoenix.
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (PHOENIX_MINIO, or
# minio on the PATH, or ~/go/bin/minio), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-readahead}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
num=${NUM:-500000}
runs=${RUNS:-3}
latency=${LATENCY_MS:-1}
scan=${SCAN:-200000}
seeks=${SEEKS:-50}
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
echo "NUM=$num RUNS=$runs LATENCY_MS=$latency"

store="s3://phoenix/bench?endpoint=http://127.0.0.1:$port&added_latency_ms=$latency"
common=(--num "$num" --key_size 16 --value_size 100 --cache_size 0 --sst_store "$store")
results=$out/results.jsonl
: >"$results"
bench() { # setting run threads benchmarks reads extra...
  local setting=$1 run=$2 threads=$3 benchmarks=$4 r=$5
  shift 5
  "$phoenix" --output json bench engine "${common[@]}" --db "$out/db" --threads "$threads" \
    --benchmarks "$benchmarks" --reads "$r" "$@" 2>>"$out/bench.err" |
    jq -c --arg s "$setting" --argjson run "$run" --argjson t "$threads" \
      '.results[] | {setting: $s, run: $run, threads: $t, name, seconds, ops_per_sec, mb_per_sec, p50_us: .latency.p50_us, p99_us: .latency.p99_us}' \
      >>"$results"
}
for run in $(seq 1 "$runs"); do
  order=(on off)
  [ $((run % 2)) -eq 0 ] && order=(off on)
  for setting in "${order[@]}"; do
    flags=()
    [ "$setting" = off ] && flags=(--readahead_max 0 --compaction_readahead_size 0)
    echo "run $run: readahead $setting"
    rm -rf "$out/db"
    # (The bucket keeps the tables of the last database: a fresh prefix per database.)
    common[-1]="${store/bench/bench-$run-$setting}"
    bench "$setting" "$run" 1 fillrandom,compact "$seeks" "${flags[@]}"
    bench "$setting" "$run" 1 readseq "$scan" --use_existing_db "${flags[@]}"
    for t in 1 8; do
      bench "$setting" "$run" "$t" seekrandom "$seeks" --seek_nexts 1000 --use_existing_db "${flags[@]}"
    done
  done
done

echo
echo "Medians of $runs runs (ops/s; MB/s for the fill and the scans; compact in seconds; p50/p99 in microseconds)"
jq -rs '
  def med(f): map(f // 0) | sort | .[length / 2 | floor];
  group_by([.name, .threads, .setting])
  | map({setting: .[0].setting, name: .[0].name, threads: .[0].threads,
         secs: med(.seconds), ops: med(.ops_per_sec), mb: med(.mb_per_sec),
         p50: med(.p50_us), p99: med(.p99_us), all: map(.ops_per_sec // .seconds)})
  | sort_by(.name, .threads, .setting)
  | .[] | "\(.name)\tthreads \(.threads)\treadahead \(.setting)\t\(.ops) ops/s\t\(.mb * 10 | round / 10) MB/s\t\(.secs * 100 | round / 100) s\tp50 \(.p50 * 10 | round / 10)\tp99 \(.p99 * 10 | round / 10)\truns \(.all | map(tostring) | join(", "))"
' "$results" | column -t -s $'\t'
