#!/usr/bin/env bash
# Fault runs on random seeds (issue "The node, rebuilt around the replica", bar 2; issue
# "Groups that move…", bar 1): `phoenix check` with the nemesis rounds of the
# linearizability tests of crates/cli/tests/linearizable.rs in turn (kill -9 and SIGSTOP;
# partitions and disk errors; power loss, whole-cluster included, each 27 s on a fresh
# 3-node cluster; chaos: 90 s on 5 nodes while groups split by load, merge back, and
# replicas are repaired and balanced), each with a new random seed, until RUNS runs are done or SECS
# seconds have passed. One line per run: which, seed, verdict. A failing run keeps its
# data, logs and history under OUT_DIR; replay it with `phoenix check --seed <seed>` and
# the same flags.
#
# Usage: crates/cli/scripts/fault-runs.sh [OUT_DIR] [RUNS] [SECS]
# FAMILIES (environment) picks the mixes, e.g. FAMILIES=chaos (default: kill partition
# powerloss).
# Needs: cargo (phoenix is built in release mode first), or PHOENIX_BIN naming a built
# `phoenix` (a copy, so that builds meanwhile do not change what runs). Nothing else
# should run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-fault-runs}
runs=${2:-200}
secs=${3:-999999}
mkdir -p "$out"
read -r -a names <<<"${FAMILIES:-kill partition powerloss}"
flags_of() {
  case $1 in
    kill) echo "--secs 27 --rounds kill-leader,pause-leader,kill-random,kill-leader" ;;
    partition) echo "--secs 27 --rounds partition-leader,diskerror-leader,partition-random,diskerror-random" ;;
    powerloss) echo "--secs 27 --rounds kill-leader,kill-all,kill-random,kill-all --power-loss" ;;
    chaos) echo "--secs 90 --nodes 5 --keys 8 --rounds kill-random-long,kill-leader,pause-random,partition-leader,kill-random,kill-random-long --server-arg=--down-after=5s --server-arg=--split-qps=150 --server-arg=--split-check-interval=2s --server-arg=--merge-size-mb=64 --server-arg=--merge-after=4s" ;;
    *) echo "unknown family $1" >&2; exit 2 ;;
  esac
}
for n in "${names[@]}"; do flags_of "$n" >/dev/null || exit 2; done
bin=${PHOENIX_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -p phoenix-cli >"$out/build.txt" 2>&1 ||
    { cat "$out/build.txt" >&2; exit 1; }
  bin=target/release/phoenix
fi
start=$SECONDS
pass=0; fail=0
for i in $(seq 1 "$runs"); do
  [ $((SECONDS - start)) -lt "$secs" ] || break
  k=$(( (i - 1) % ${#names[@]} ))
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  dir="$out/run-$i"
  # shellcheck disable=SC2086 # the flags are words
  if "$bin" check --seed "$seed" --dir "$dir" $(flags_of "${names[$k]}") >"$out/run-$i.txt" 2>&1; then
    healed=$(grep -o 'whole again by [0-9.]* s' "$out/run-$i.txt" || true)
    merged=$(grep -o '[0-9]* merged away' "$out/run-$i.txt" || true)
    pass=$((pass + 1)); echo "run $i ${names[$k]} seed $seed ok${healed:+ ($healed${merged:+, $merged})}"
    rm -rf "$dir" "$out/run-$i.txt"
  else
    fail=$((fail + 1)); echo "run $i ${names[$k]} seed $seed FAILED (report: $out/run-$i.txt, data: $dir)"
  fi
done
echo "fault runs: $((pass + fail)), passed $pass, failed $fail"
