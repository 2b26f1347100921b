#!/usr/bin/env bash
# Listings on a 3-node cluster next to etcd: ROUNDS rounds of `phoenix bench cluster`
# with the listing workload (every key written first, then only listings: pages of
# SCAN_LIMIT keys from a random object of a random directory), PhoenixKV then etcd, each
# on a fresh spawned cluster, at 16 and 64 clients. Summary tables go to OUT.
#
#   PHOENIX_BIN=target/release/phoenix crates/cli/scripts/listing-vs-etcd.sh OUT [ROUNDS]
#
# Settings (environment): KEYS (100000), DIRS (100), SCAN_LIMIT (100), SECS (15),
# CLIENTS (16,64), DIR (/tmp/phoenix-listing).
set -euo pipefail
out=${1:?usage: listing-vs-etcd.sh OUT [ROUNDS]}
rounds=${2:-3}
bin=${PHOENIX_BIN:-target/release/phoenix}
: >"$out"
for round in $(seq 1 "$rounds"); do
  echo "== round $round" | tee -a "$out"
  "$bin" bench cluster --spawn "${DIR:-/tmp/phoenix-listing}" --target phoenix,etcd \
    --clients "${CLIENTS:-16,64}" --key-layout listing --key_size 32 \
    --keys "${KEYS:-100000}" --dirs "${DIRS:-100}" --value_size 128 --fill \
    --scan_ratio 1 --scan_limit "${SCAN_LIMIT:-100}" --duration "${SECS:-15}" \
    --ops 1000000000 --seed "$round" 2>&1 |
    grep -E '^(   (phoenix|etcd|fill):|   listings:|\| )' | tee -a "$out"
done
