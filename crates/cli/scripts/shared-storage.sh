#!/usr/bin/env bash
# Tables on a real S3 server (issue "Data on shared storage", bar 3): `phoenix bench
# engine` with its tables in its local directory, on MinIO on loopback, and on MinIO with
# 1 ms added to every request (`added_latency_ms`: a store measured as one across a
# network); each remote one without and with the flash cache (1 GiB). For each: fillseq
# and fillrandom (1 thread, NUM entries of 16-byte keys and 100-byte values), then on the
# fillrandom database readrandom, multireadrandom (10 keys 32 apart) and seekrandom with
# 10 nexts, at 1, 8 and 32 threads. RUNS runs of each; the table printed at the end holds
# the medians.
#
# Usage: crates/cli/scripts/shared-storage.sh [OUT_DIR]
# NUM (default 1000000), RUNS (default 3), READS (reads per thread, default 10000;
# REMOTE_READS without a flash cache, where each block read is a request: default 200).
# ONLY: the configurations to run, by name (default: all but the `-serial` ones, which
# read a multi_get's blocks, and the tables of a seek, one after the other:
# `--parallel_io=false`; `minio-serial`, `minio-1ms-serial`, and with the flash cache
# `minio+flash-serial`, `minio-1ms+flash-serial`). READ_BENCHES:
# the read benchmarks (default readrandom,multireadrandom,seekrandom).
# PHOENIX_BIN runs that binary instead of target/release/phoenix.
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (PHOENIX_MINIO, or
# minio on the PATH, or ~/go/bin/minio: `go install github.com/minio/minio@<version in
# .ci/run>`), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-shared-storage}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
num=${NUM:-1000000}
runs=${RUNS:-3}
reads=${READS:-10000}
remote_reads=${REMOTE_READS:-200}
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
echo "NUM=$num RUNS=$runs"

common=(--num "$num" --key_size 16 --value_size 100 --multiread_stride 32 --batch_size 10 --seek_nexts 10)
# name | extra flags
configs=(
  "local|"
  "minio|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port"
  "minio+flash|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port --flash_cache_size 1073741824"
  "minio-1ms|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port&added_latency_ms=1"
  "minio-1ms+flash|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port&added_latency_ms=1 --flash_cache_size 1073741824"
  "minio-serial|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port --parallel_io=false"
  "minio-1ms-serial|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port&added_latency_ms=1 --parallel_io=false"
  "minio+flash-serial|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port --flash_cache_size 1073741824 --parallel_io=false"
  "minio-1ms+flash-serial|--sst_store s3://phoenix/bench?endpoint=http://127.0.0.1:$port&added_latency_ms=1 --flash_cache_size 1073741824 --parallel_io=false"
)
only=${ONLY:-local minio minio+flash minio-1ms minio-1ms+flash}
read_benches=${READ_BENCHES:-readrandom,multireadrandom,seekrandom}
results=$out/results.jsonl
: >"$results"
bench() { # config run threads benchmarks reads extra...
  local config=$1 run=$2 threads=$3 benchmarks=$4 r=$5
  shift 5
  # shellcheck disable=SC2068
  "$phoenix" --output json bench engine "${common[@]}" --db "$out/db-$config" --threads "$threads" \
    --benchmarks "$benchmarks" --reads "$r" $@ 2>>"$out/bench.err" |
    jq -c --arg c "$config" --argjson run "$run" --argjson t "$threads" \
      '.results[] | {config: $c, run: $run, threads: $t, name, ops_per_sec, mb_per_sec, p50_us: .latency.p50_us, p99_us: .latency.p99_us}' \
      >>"$results"
}
for run in $(seq 1 "$runs"); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    extra=${c#*|}
    case " $only " in *" $name "*) ;; *) continue ;; esac
    r=$reads
    case "$name" in *flash* | local) ;; *) r=$remote_reads ;; esac
    echo "run $run: $name"
    # (A fresh directory: a flash cache starts empty and warms as the fill writes.)
    rm -rf "$out/db-$name"
    # shellcheck disable=SC2086
    bench "$name" "$run" 1 fillseq,fillrandom "$r" $extra
    for t in 1 8 32; do
      # shellcheck disable=SC2086
      bench "$name" "$run" "$t" "$read_benches" "$r" $extra --use_existing_db
    done
  done
done

echo
echo "Medians of $runs runs (ops/s; MB/s for fills; p50/p99 in microseconds)"
jq -rs '
  group_by([.config, .name, .threads])
  | map({config: .[0].config, name: .[0].name, threads: .[0].threads,
         ops: (map(.ops_per_sec) | sort | .[length / 2 | floor]),
         mb: (map(.mb_per_sec // 0) | sort | .[length / 2 | floor]),
         p50: (map(.p50_us) | sort | .[length / 2 | floor]),
         p99: (map(.p99_us) | sort | .[length / 2 | floor])})
  | sort_by(.name, .threads, .config)
  | .[] | "\(.name)\tthreads \(.threads)\t\(.config)\t\(.ops) ops/s\t\(.mb * 10 | round / 10) MB/s\tp50 \(.p50 * 10 | round / 10)\tp99 \(.p99 * 10 | round / 10)"
' "$results" | column -t -s $'\t'
