#!/usr/bin/env bash
# Scale of one node (issue "The node, rebuilt around the replica", bar 4): a 3-node
# loopback cluster bootstrapped with N groups (`phoenix server --initial-groups N`).
# For each N: idle CPU per node (share of one core over SAMPLE_SECS, 3 samples, median)
# once the groups are asleep, and resident memory per node; then writes at 64 clients
# spread over every group (`--key-layout hashed`) next to the same writes on one group.
#
# Usage: crates/cli/scripts/scale.sh [OUT_DIR] [N...]   (default N: 1000 10000)
# SERVER_ARGS adds flags to every `phoenix server` (e.g. "--hibernate-ticks=100").
# PHOENIX_BIN runs that binary instead of target/release/phoenix (a copy: an A/B of two
# builds, or a build going on meanwhile).
# Needs: a release build (cargo build --release -p phoenix-cli), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-scale}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000 10000)
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
sample_secs=${SAMPLE_SECS:-10}
bench_secs=${BENCH_SECS:-20}
ticks=$(getconf CLK_TCK)
mkdir -p "$out"

pg_pid=""
stop_cluster() {
  if [ -n "$pg_pid" ] && kill -0 "$pg_pid" 2>/dev/null; then
    kill -INT "$pg_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pg_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pg_pid" 2>/dev/null || true
  fi
  pg_pid=""
}
trap stop_cluster EXIT

# Starts a playground with N groups under $out/run-N; sets pg_pid and endpoints.
start_cluster() {
  local n=$1 dir=$out/run-$1
  rm -rf "$dir"; mkdir -p "$dir"
  # Created before the poll below reads it (the background job's redirection may not
  # have run yet, and a failed read ends the script).
  : >"$dir/out"
  set -m
  "$phoenix" playground --data-dir "$dir/data" --base-port 0 --output json \
    --ready-timeout 600 --server-arg=--initial-groups="$n" --server-arg=--merge-size-mb=0 \
    $(for a in ${SERVER_ARGS:-}; do printf -- '--server-arg=%s ' "$a"; done) \
    >"$dir/out" 2>"$dir/err" </dev/null &
  pg_pid=$!
  set +m
  local t0=$SECONDS
  endpoints=""
  while [ -z "$endpoints" ]; do
    endpoints=$(sed -n 's/.*"endpoints":"\([^"]*\)".*/\1/p' "$dir/out")
    kill -0 "$pg_pid" 2>/dev/null || { cat "$dir/err" >&2; echo "playground exited" >&2; exit 1; }
    sleep 0.5
  done
  echo "N=$n: cluster ready after $((SECONDS - t0)) s ($endpoints)"
}

# Waits until the groups (all but at most 1%) are asleep, at most 300 s.
wait_asleep() {
  local n=$1 line asleep
  for _ in $(seq 1 300); do
    line=$("$phoenix" cluster status --endpoints "$endpoints" 2>/dev/null | grep -m1 '^GROUPS' || true)
    asleep=$(sed -n 's/.* \([0-9]*\) asleep.*/\1/p' <<<"$line")
    if [ -n "$asleep" ] && [ "$asleep" -ge $((n * 99 / 100)) ]; then
      echo "N=$n: $line"
      return
    fi
    sleep 1
  done
  echo "N=$n: groups not asleep after 300 s: $line"
}

# Sum over groups of the highest term a replica reports: its growth between two calls
# counts the elections in between (pre-vote keeps a failed campaign from raising it).
term_sum() {
  "$phoenix" cluster status --endpoints "$endpoints" --output json 2>/dev/null |
    jq '[.groups[] | [.replica_status[].term] | max // 0] | add // 0'
}

# The playground's children are its servers (whatever the binary is called).
server_pids() { pgrep -P "$pg_pid" -f ' server ' | sort -n; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }

# Waits until the balancers are done (at most 600 s): no operator under way and no term
# moved over 10 s. A cluster bootstrapped with many groups starts with its leaders
# uneven, and the leader balancer's transfers (thousands) are no idle state.
wait_settled() {
  local n=$1 t0 t1 ops
  for _ in $(seq 1 60); do
    # (A status call that fails counts as "not settled", not as the script's end.)
    t0=$(term_sum || echo x); sleep 10; t1=$(term_sum || echo y)
    ops=$("$phoenix" cluster status --endpoints "$endpoints" --output json 2>/dev/null |
      jq '.operators | length' || echo unknown)
    if [ "$t0" = "$t1" ] && [ "$ops" = 0 ]; then
      echo "N=$n: settled (no election nor operator for 10 s)"
      return
    fi
  done
  echo "N=$n: still balancing after 600 s"
}

for n in "${sizes[@]}"; do
  start_cluster "$n"
  wait_asleep "$n"
  wait_settled "$n"
  terms0=$(term_sum)
  for pid in $(server_pids); do
    samples=()
    for _ in 1 2 3; do
      a=$(cpu_ticks "$pid"); sleep "$sample_secs"; b=$(cpu_ticks "$pid")
      samples+=("$(awk -v d=$((b - a)) -v t="$ticks" -v s="$sample_secs" 'BEGIN{printf "%.2f", 100 * d / t / s}')")
    done
    rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")
    echo "N=$n pid=$pid idle_cpu_pct=$(median3 "${samples[@]}") (samples ${samples[*]}) rss_kib=$rss"
  done
  terms1=$(term_sum)
  echo "N=$n elections while idle: $((terms1 - terms0))"
  if [ "${SKIP_WRITES:-0}" != 1 ]; then
    "$phoenix" bench cluster --endpoints "$endpoints" --clients 64 --ops 1000000000 \
      --duration "$bench_secs" --key_size 16 --value_size 128 --keys 1000000 \
      --key-layout hashed >"$out/writes-$n-groups.txt" 2>&1
    echo "N=$n writes spread over all groups: $(grep -E '^\| phoenix ' "$out/writes-$n-groups.txt" | tail -1)"
    echo "N=$n elections during the writes: $(($(term_sum) - terms1))"
  fi
  stop_cluster
done

if [ "${SKIP_WRITES:-0}" != 1 ]; then
  start_cluster 1
  terms0=$(term_sum)
  "$phoenix" bench cluster --endpoints "$endpoints" --clients 64 --ops 1000000000 \
    --duration "$bench_secs" --key_size 16 --value_size 128 --keys 1000000 \
    --key-layout hashed >"$out/writes-1-group.txt" 2>&1
  echo "N=1 writes on one group: $(grep -E '^\| phoenix ' "$out/writes-1-group.txt" | tail -1)"
  echo "N=1 elections during the writes: $(($(term_sum) - terms0))"
  stop_cluster
fi
