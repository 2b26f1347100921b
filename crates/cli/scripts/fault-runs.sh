#!/usr/bin/env bash
# Fault runs on random seeds (issue "The node, rebuilt around the replica", bar 2):
# `phoenix check` with the nemesis rounds of the three linearizability tests of
# crates/cli/tests/linearizable.rs in turn (kill -9 and SIGSTOP; partitions and disk
# errors; power loss, whole-cluster included), each on a fresh 3-node cluster with a new
# random seed, until RUNS runs are done or SECS seconds have passed. One line per run:
# which, seed, verdict. A failing run keeps its data, logs and history under OUT_DIR;
# replay it with `phoenix check --seed <seed>` and the same rounds.
#
# Usage: crates/cli/scripts/fault-runs.sh [OUT_DIR] [RUNS] [SECS]
# Needs: cargo (phoenix is built in release mode first), or PHOENIX_BIN naming a built
# `phoenix` (a copy, so that builds meanwhile do not change what runs). Nothing else
# should run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-fault-runs}
runs=${2:-200}
secs=${3:-999999}
mkdir -p "$out"
names=(kill partition powerloss)
flags=("--rounds kill-leader,pause-leader,kill-random,kill-leader"
       "--rounds partition-leader,diskerror-leader,partition-random,diskerror-random"
       "--rounds kill-leader,kill-all,kill-random,kill-all --power-loss")
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
  if "$bin" check --seed "$seed" --secs 27 --dir "$dir" ${flags[$k]} >"$out/run-$i.txt" 2>&1; then
    pass=$((pass + 1)); echo "run $i ${names[$k]} seed $seed ok"
    rm -rf "$dir" "$out/run-$i.txt"
  else
    fail=$((fail + 1)); echo "run $i ${names[$k]} seed $seed FAILED (report: $out/run-$i.txt, data: $dir)"
  fi
done
echo "fault runs: $((pass + fail)), passed $pass, failed $fail"
