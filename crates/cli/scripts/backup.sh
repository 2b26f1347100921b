#!/usr/bin/env bash
# Backup and restore (issue "Data on shared storage", bar 6): `phoenix bench backup`
# RUNS times on MinIO on loopback: a 3-node cluster filled with FILL_MIB MiB over
# NGROUPS groups is backed up while writers go on, and a new 3-node cluster is restored
# from the backup and checked (every write acknowledged before the backup began is
# there with its value; nothing unknown is). Each run's JSON line goes to
# OUT_DIR/results.jsonl; the bench fails if a write is missing.
#
# Usage: crates/cli/scripts/backup.sh [OUT_DIR]
# FILL_MIB (default 256), NGROUPS (default 8), RUNS (default 3). PHOENIX_BIN runs that
# binary instead of target/release/phoenix.
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (see minio.sh).
# Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-backup}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
fill=${FILL_MIB:-256}
groups=${NGROUPS:-8}
runs=${RUNS:-3}
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
echo "FILL_MIB=$fill NGROUPS=$groups RUNS=$runs"
for run in $(seq 1 "$runs"); do
  echo "run $run"
  "$phoenix" --output json bench backup --fill-mib "$fill" --groups "$groups" \
    --sst-store "s3://phoenix/b?endpoint=http://127.0.0.1:$port" \
    --dir "$out/run-$run" 2>>"$out/bench.err" | tee -a "$out/results.jsonl"
  rm -rf "$out/run-$run"
done
