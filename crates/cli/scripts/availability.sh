#!/usr/bin/env bash
# Availability under one-node-at-a-time faults, PhoenixKV next to etcd (issue: "The node,
# rebuilt around the replica", bar 3): paired 60 s runs per seed, each target on a fresh
# 3-node loopback cluster, the same nemesis schedule for both (kill -9 then restart, or
# SIGSTOP then SIGCONT, one node every 1-3 s, down 0.5-2.5 s), with long-lived clients
# (grpc) and with one CLI process per operation (cli: `phoenix get/put` vs `etcdctl`).
#
# Usage: crates/cli/scripts/availability.sh [OUT_DIR] [SEEDS...]
# Needs: a release build of `phoenix` (cargo build --release -p phoenix-cli), etcd and
# etcdctl on the PATH (Debian: etcd-server, etcd-client). Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-availability}
shift || true
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
phoenix=target/release/phoenix
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
command -v etcd >/dev/null && command -v etcdctl >/dev/null || { echo "etcd and etcdctl are needed" >&2; exit 1; }
mkdir -p "$out"
secs=${PHOENIX_AVAIL_SECS:-60}
for seed in "${seeds[@]}"; do
  for mode in grpc cli; do
    clients=16
    [ "$mode" = cli ] && clients=4
    f="$out/$mode-seed$seed.txt"
    echo "== seed $seed, $mode, $clients clients -> $f"
    "$phoenix" bench cluster --spawn "$out/spawn" --target phoenix,etcd \
      --nemesis kill,pause --client-mode "$mode" --clients "$clients" \
      --ops 1000000000 --duration "$secs" --read_ratio 0.5 --keys 1000 --seed "$seed" \
      >"$f" 2>&1
    grep -E '^\| (phoenix|etcd) ' "$f"
  done
done
