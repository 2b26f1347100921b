#!/usr/bin/env bash
# Seed 000's Fig. 12 on this engine (issue "Groups that move, split, merge and repair
# themselves", bar 4): SST files and bytes against the number of keys, with the
# group-cut compaction on (files cut at every group boundary from L1 down, so a group
# is dropped by deleting files) and off (files cut by size only). Each point: a fresh
# database, `phoenix bench engine --benchmarks fillrandom,compact` over GROUPS groups,
# then the SST files counted.
#
# Usage: crates/cli/scripts/group-files.sh [OUT_DIR] [KEYS...]   (default KEYS: 500000
# 1000000 2000000 4000000). Settings: NGROUPS (256), VALUE (100), PHOENIX_BIN.
# Needs: a release build (cargo build --release -p phoenix-cli). Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-group-files}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(500000 1000000 2000000 4000000)
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
groups=${NGROUPS:-256}
value=${VALUE:-100}
mkdir -p "$out"
printf '%-9s %-4s %7s %10s %12s %12s\n' keys cut files MiB "mean KiB" "fill s"
for n in "${sizes[@]}"; do
  for mode in on off; do
    db="$out/db-$n-$mode"
    rm -rf "$db"
    if [ "$mode" = on ]; then min=0; else min=18446744073709551615; fi
    t0=$(date +%s.%N)
    "$phoenix" bench engine --benchmarks fillrandom,compact --num "$n" --value_size "$value" \
      --groups "$groups" --min_group_file_size "$min" --db "$db" >"$db.txt" 2>&1
    el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    files=$(find "$db" -name '*.sst' | wc -l)
    bytes=$(find "$db" -name '*.sst' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    printf '%-9s %-4s %7d %10.1f %12.1f %12s\n' "$n" "$mode" "$files" \
      "$(awk -v b="$bytes" 'BEGIN{print b / 1048576}')" \
      "$(awk -v b="$bytes" -v f="$files" 'BEGIN{print f ? b / f / 1024 : 0}')" "$el"
    rm -rf "$db"
  done
done
