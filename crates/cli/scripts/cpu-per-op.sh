#!/usr/bin/env bash
# CPU per Redis command, node by node: runs `redis-benchmark -t TEST -n N -r 100000 -c 50
# -d 16 -q` against PORT and prints its rate, then the CPU time (user + system, from
# /proc) each running `phoenix server` process spent meanwhile, in microseconds per
# command. Run against a playground's leader port and a follower's port to see where a
# command passed on by a follower spends its time.
#
#   crates/cli/scripts/cpu-per-op.sh PORT [TEST=set] [N=200000]
#
# Needs: redis-benchmark (redis-tools), a running playground. Nothing else should run.
set -euo pipefail
port=${1:?usage: cpu-per-op.sh PORT [TEST] [N]}
test=${2:-set}
n=${3:-200000}
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (redis-tools)" >&2; exit 2; }
mapfile -t pids < <(pgrep -f 'phoenix server' || true)
[ ${#pids[@]} -gt 0 ] || { echo "no phoenix server running" >&2; exit 1; }
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A before
for p in "${pids[@]}"; do before[$p]=$(cpu "$p"); done
redis-benchmark -p "$port" -t "$test" -n "$n" -r 100000 -c 50 -d 16 -q 2>/dev/null | tr '\r' '\n' |
  grep -E '^[A-Z]+: ' | tail -1
total=0
for p in "${pids[@]}"; do
  used=$(($(cpu "$p") - ${before[$p]}))
  total=$((total + used))
  id=$(tr '\0' ' ' <"/proc/$p/cmdline" | sed -n 's/.*--id \([0-9]*\).*/\1/p')
  awk -v id="$id" -v u="$used" -v t="$ticks" -v n="$n" \
    'BEGIN { printf "node %s: %.1f us per command (%.2f s)\n", id, u / t * 1e6 / n, u / t }'
done
awk -v u="$total" -v t="$ticks" -v n="$n" 'BEGIN { printf "nodes together: %.1f us per command\n", u / t * 1e6 / n }'
