#!/usr/bin/env bash
# Compactions on a worker (issue "Data on shared storage", bar 5; seed 004 §7.2): a
# write-heavy engine run with its tables on MinIO on loopback, its compactions run in
# its own process ("node") or handed to `phoenix compactor` ("worker", another process
# on this machine). Each run: fillrandom (NUM entries of 16-byte keys and 100-byte
# values, THREADS writers, 16 MiB memtables so L0 fills and is compacted many times),
# then waitforcompaction (until nothing is due). Reported: the fill's ops/s, the writing
# process's CPU seconds over the fill and over the wait, and the worker's CPU seconds
# over both. RUNS runs of each, alternating; the table printed at the end holds medians.
#
# Usage: crates/cli/scripts/compactor.sh [OUT_DIR]
# NUM (default 3000000), THREADS (default 1), RUNS (default 3). PHOENIX_BIN runs that
# binary instead of target/release/phoenix.
# Needs: a release build (cargo build --release -p phoenix-cli), MinIO (see minio.sh),
# jq. Nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/phoenix-compactor}
phoenix=${PHOENIX_BIN:-$PWD/target/release/phoenix}
[ -x "$phoenix" ] || { echo "build first: cargo build --release -p phoenix-cli" >&2; exit 1; }
num=${NUM:-3000000}
threads=${THREADS:-1}
runs=${RUNS:-3}
rm -rf "$out"; mkdir -p "$out"
# shellcheck source=crates/cli/scripts/minio.sh
. crates/cli/scripts/minio.sh
start_minio "$out"
wport=$((port + 2))
"$phoenix" compactor --listen "127.0.0.1:$wport" \
  --sst-store "s3://phoenix/c?endpoint=http://127.0.0.1:$port" --jobs 2 >"$out/compactor.log" 2>&1 &
worker_pid=$!
# shellcheck disable=SC2064
trap "kill $worker_pid $minio_pid 2>/dev/null || true" EXIT
sleep 1
kill -0 "$worker_pid" || { cat "$out/compactor.log" >&2; exit 1; }
cpu() { # CPU seconds of process $1 (utime + stime at 100 ticks/s)
  awk '{ sub(/^.*\) /, ""); print ($12 + $13) / 100 }' "/proc/$1/stat"
}
echo "NUM=$num THREADS=$threads RUNS=$runs"
results=$out/results.jsonl
: >"$results"
for run in $(seq 1 "$runs"); do
  for config in node worker; do
    extra=()
    [ "$config" = worker ] && extra=(--compactor "127.0.0.1:$wport")
    echo "run $run: $config"
    w0=$(cpu "$worker_pid")
    "$phoenix" --output json bench engine --benchmarks fillrandom,waitforcompaction,stats \
      --num "$num" --threads "$threads" --key_size 16 --value_size 100 \
      --write_buffer_size 16777216 --db "$out/db-$config-$run" \
      --sst_store "s3://phoenix/c/$config-$run?endpoint=http://127.0.0.1:$port" \
      "${extra[@]}" 2>>"$out/bench.err" | tee -a "$out/bench.out" |
      jq -c --arg c "$config" --argjson run "$run" \
        '{config: $c, run: $run,
          ops: (.results[] | select(.name == "fillrandom") | .ops_per_sec),
          fill_cpu: (.results[] | select(.name == "fillrandom") | .cpu_secs),
          wait_s: (.results[] | select(.name == "waitforcompaction") | .seconds),
          wait_cpu: (.results[] | select(.name == "waitforcompaction") | .cpu_secs)}' \
        >"$out/row.json"
    # (The worker's CPU is read after the bench ends: its jobs are done by then.)
    jq -c --argjson w1 "$(cpu "$worker_pid")" --argjson w0 "$w0" '. + {worker_cpu: ($w1 - $w0)}' \
      "$out/row.json" | tee -a "$results"
    rm -rf "$out/db-$config-$run"
  done
done

echo
echo "Medians of $runs runs"
jq -rs '
  def med(f): map(f) | sort | .[length / 2 | floor];
  group_by(.config)
  | map({config: .[0].config, ops: med(.ops), fill_cpu: med(.fill_cpu), wait_s: med(.wait_s),
         wait_cpu: med(.wait_cpu), worker_cpu: med(.worker_cpu)})
  | .[] | "\(.config)\tfillrandom \(.ops) ops/s\tnode CPU: fill \(.fill_cpu * 100 | round / 100) s, wait \(.wait_cpu * 100 | round / 100) s (\(.wait_s * 10 | round / 10) s)\tworker CPU \(.worker_cpu * 100 | round / 100) s"
' "$results" | column -t -s $'\t'
