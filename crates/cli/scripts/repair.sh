#!/usr/bin/env bash
# Repair time (issue "Groups that move, split, merge and repair themselves", bar 2): a
# 4-node loopback cluster (nodes 1-3 in the meta group) bootstrapped with NGROUPS groups
# (3 replicas each), filled with KEYS keys of VALUE bytes, then node KILL is killed -9
# for good. Prints, every 2 s and at the end, how many of the groups that had a replica
# on it have 3 voters on live nodes again, and the time until all have (from the kill,
# and from when the node counts as down: --down-after). With KILL in 1-3 a meta member
# dies: the time until the meta group is whole again (3 members on live nodes) too.
#
# Usage: crates/cli/scripts/repair.sh [OUT_DIR]
# Settings (environment): NGROUPS (256), KEYS (100000), VALUE (256), KILL (4),
# DOWN_AFTER (5s), SERVER_ARGS (more `phoenix server` flags), PHOENIX_BIN.
# Needs: a release build (cargo build --release -p phoenix-cli), jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-repair}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
groups=${NGROUPS:-256}
keys=${KEYS:-100000}
value=${VALUE:-256}
kill_node=${KILL:-4}
down_after=${DOWN_AFTER:-5s}
rm -rf "$out"; mkdir -p "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addrs=()
for i in 1 2 3 4; do addrs+=("127.0.0.1:$(free_port)"); done
meta="1@${addrs[0]},2@${addrs[1]},3@${addrs[2]}"
endpoints=$(IFS=,; echo "${addrs[*]}")
pids=()
stop_all() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap stop_all EXIT
for i in 1 2 3 4; do
  "$phoenix" server --id "$i" --listen "${addrs[$((i - 1))]}" --data-dir "$out/node-$i" \
    --meta "$meta" --initial-groups "$groups" --down-after "$down_after" --merge-size-mb 0 \
    ${SERVER_ARGS:-} 2>"$out/node-$i.log" &
  pids+=($!)
done

status() { "$phoenix" cluster status --endpoints "$endpoints" --output json 2>/dev/null; }
# Groups with a leader, and (with $1) those that place a replica on node $1.
for _ in $(seq 1 300); do
  led=$(status | jq '[.groups[] | select(.leader != null and .leader != 0)] | length' 2>/dev/null || echo 0)
  [ "$led" -ge "$groups" ] && break
  sleep 1
done
echo "cluster up: $led of $groups groups led"
# The replica balancer evens out the bootstrap's placement first (the first nodes up
# get every group): wait until no operator is under way for 3 s.
quiet=0
for _ in $(seq 1 600); do
  ops=$(status | jq '.operators | length' 2>/dev/null || echo 1)
  if [ "$ops" -eq 0 ]; then quiet=$((quiet + 1)); else quiet=0; fi
  [ "$quiet" -ge 6 ] && break
  sleep 0.5
done
echo "placement settled: replicas per node $(status | jq -c '[.groups[].replicas[]] | group_by(.) | map({(.[0] | tostring): length}) | add')"
"$phoenix" bench cluster --endpoints "$endpoints" --clients 32 --keys "$keys" --fill \
  --key_size 16 --value_size "$value" --key-layout hashed --ops "$keys" >"$out/fill.txt" 2>&1
echo "filled: $(grep -E '^\| phoenix ' "$out/fill.txt" | tail -1)"
affected=$(status | jq --argjson k "$kill_node" '[.groups[] | select(.replicas | index($k))] | length')
echo "node $kill_node hosts $affected of $groups groups; killing it (down after $down_after)"
kill -KILL "${pids[$((kill_node - 1))]}"
t0=$(date +%s.%N)
last=-1
meta_s=
while true; do
  s=$(status) || { sleep 0.5; continue; }
  # The meta group too (KILL in 1-3 kills a meta member): 3 voters, none the killed node.
  if [ -z "$meta_s" ] && jq -e --argjson k "$kill_node" \
    '(.meta_members | index($k)) == null and (.meta_members | length) == 3 and (.meta_learners | length) == 0' \
    <<<"$s" >/dev/null; then
    meta_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    echo "t=${meta_s}s meta group whole: members $(jq -c .meta_members <<<"$s")"
  fi
  # Repaired: 3 voters, none of them the killed node.
  done_n=$(jq --argjson k "$kill_node" \
    '[.groups[] | select((.replicas | index($k)) == null and ((.replicas - .learners) | length) == 3)] | length' <<<"$s")
  left=$((groups - done_n))
  now=$(date +%s.%N)
  el=$(awk -v a="$t0" -v b="$now" 'BEGIN{printf "%.1f", b - a}')
  if [ "$left" != "$last" ]; then
    ops=$(jq '.operators | length' <<<"$s")
    echo "t=${el}s repaired $((affected - left)) of $affected (operators under way: $ops)"
    last=$left
  fi
  [ "$left" -eq 0 ] && [ -n "$meta_s" ] && break
  awk -v e="$el" 'BEGIN{exit !(e > 900)}' && { echo "not repaired within 900 s" >&2; exit 1; }
  sleep 0.5
done
da=$(awk -v d="$down_after" 'BEGIN{sub(/s$/, "", d); print d + 0}')
echo "RESULT groups=$groups affected=$affected keys=$keys value=$value down_after=$down_after repair_s=$el after_down_s=$(awk -v e="$el" -v d="$da" 'BEGIN{printf "%.1f", e - d}') meta_whole_s=$meta_s"
