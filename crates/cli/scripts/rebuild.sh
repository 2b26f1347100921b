#!/usr/bin/env bash
# Replica rebuild on shared storage, by copy and by streaming (issue "Data on shared
# storage", bar 4; seed 004 §6.2): starts a MinIO on loopback and runs
# `phoenix bench rebuild` against it (a 3-node cluster whose tables are in the bucket;
# a group of each size rebuilt on node 3 both ways; time, bytes streamed and copied,
# the nodes' CPU). Extra arguments go to the bench (e.g. --sizes 64,256).
#
# Usage: crates/cli/scripts/rebuild.sh [OUT_DIR] [-- bench flags]
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (see minio.sh).
# Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-rebuild}
shift || true
[ "${1:-}" = "--" ] && shift
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
echo "phoenix $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%F %T') UTC"
"$phoenix" bench rebuild \
  --sst-store "s3://phoenix/bench?endpoint=http://127.0.0.1:$port" "$@"
