#!/usr/bin/env bash
# Tables uploaded whole against in parts (issue "Data on shared storage": "whole-object
# uploads (multipart for large SSTs)"): `phoenix bench engine` with its tables on MinIO,
# `multipart_part_mib=0` (every table goes up whole once it is built) against the
# default 8 MiB parts (a table goes up while it is built, 4 parts in flight), on loopback
# and with 1 ms added to every request. Per run: fillrandom (NUM entries, 16-byte keys,
# VALUE-byte values, 64 MiB memtables and tables, WAL off as on a node) then compact (a
# full compaction: every output table built and uploaded) and waitforcompaction. RUNS
# runs; medians at the end.
#
# Usage: crates/cli/scripts/multipart.sh [OUT_DIR]
# NUM (default 400000), VALUE (default 1000), RUNS (default 3). PHOENIX_BIN runs that
# binary instead of target/release/phoenix.
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (see minio.sh), jq.
# Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-multipart}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
num=${NUM:-400000}
value=${VALUE:-1000}
runs=${RUNS:-3}
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
echo "NUM=$num VALUE=$value RUNS=$runs"
results=$out/results.jsonl
: >"$results"
for run in $(seq 1 "$runs"); do
  for latency in 0 1; do
    for part in 0 8; do
      config="latency-${latency}ms parts-${part}MiB"
      echo "run $run: $config"
      url="s3://phoenix/bench-$run-$latency-$part?endpoint=http://127.0.0.1:$port&added_latency_ms=$latency&multipart_part_mib=$part"
      "$phoenix" --output json bench engine --num "$num" --key_size 16 --value_size "$value" \
        --write_buffer_size $((64 << 20)) --disable_wal --db "$out/db" --sst_store "$url" \
        --benchmarks fillrandom,compact,waitforcompaction 2>>"$out/bench.err" |
        jq -c --arg c "$config" --argjson run "$run" \
          '.results[] | {config: $c, run: $run, name, mb_per_sec, seconds}' >>"$results"
      rm -rf "$out/db"
    done
  done
done

echo
echo "Medians of $runs runs (fillrandom MB/s; compact and waitforcompaction seconds)"
jq -rs '
  group_by([.config, .name])
  | map({config: .[0].config, name: .[0].name,
         mb: (map(.mb_per_sec // 0) | sort | .[length / 2 | floor]),
         s: (map(.seconds // 0) | sort | .[length / 2 | floor]),
         all: (map(.mb_per_sec // .seconds) | map(. * 100 | round / 100))})
  | sort_by(.name, .config)
  | .[] | "\(.name)\t\(.config)\t\(if .name == "fillrandom" then "\(.mb * 10 | round / 10) MB/s" else "\(.s * 100 | round / 100) s" end)\truns \(.all)"
' "$results" | column -t -s $'\t'
