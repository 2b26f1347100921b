#!/usr/bin/env bash
# Fault runs on random seeds (issue "The node, rebuilt around the replica", bar 2): the
# linearizability tests of crates/cli/tests/linearizable.rs (kill -9 and SIGSTOP;
# partitions and disk errors; power loss) in turn, each on a fresh 3-node cluster with a
# new random seed, until RUNS runs are done or SECS seconds have passed. One line per run:
# test, seed, verdict. A failing run keeps its output (and the servers' logs) under
# OUT_DIR; replay it with PHOENIX_SEED=<seed> and the test's name.
#
# Usage: crates/cli/scripts/fault-runs.sh [OUT_DIR] [RUNS] [SECS]
# Needs: cargo (the tests are built in release mode first). Nothing else should run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-fault-runs}
runs=${2:-200}
secs=${3:-999999}
mkdir -p "$out"
tests=(operations_are_linearizable_under_kill_9
       operations_are_linearizable_under_partitions_and_disk_errors
       operations_are_linearizable_under_power_loss)
cargo test --release -p phoenix-cli --test linearizable --no-run >"$out/build.txt" 2>&1 ||
  { cat "$out/build.txt" >&2; exit 1; }
bin=$(cargo test --release -p phoenix-cli --test linearizable --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*linearizable[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "test binary not found" >&2; exit 1; }
start=$SECONDS
pass=0; fail=0
for i in $(seq 1 "$runs"); do
  [ $((SECONDS - start)) -lt "$secs" ] || break
  t=${tests[$(( (i - 1) % ${#tests[@]} ))]}
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  logs="$out/run-$i"; mkdir -p "$logs"
  if PHOENIX_SEED=$seed PHOENIX_LIN_LOGS=$logs "$bin" --exact "$t" --nocapture >"$logs/out.txt" 2>&1; then
    pass=$((pass + 1)); echo "run $i $t seed $seed ok"
    rm -rf "$logs"
  else
    fail=$((fail + 1)); echo "run $i $t seed $seed FAILED (output: $logs/out.txt)"
  fi
done
echo "fault runs: $((pass + fail)), passed $pass, failed $fail"
