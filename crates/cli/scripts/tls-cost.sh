#!/usr/bin/env bash
# What TLS and tokens cost: `phoenix bench cluster` against a spawned 3-node cluster
# (one group), plaintext and `--tls` (TLS on every hop, a token on every call),
# alternating which goes first each round. 50 clients, 16-byte keys and values, 100,000
# keys; writes then reads, 10 s each. Prints the medians and the ratio.
#   PHOENIX_BIN=target/release/phoenix bash crates/cli/scripts/tls-cost.sh [ROUNDS] [OUTDIR]
set -euo pipefail
bin=${PHOENIX_BIN:-target/release/phoenix}
runs=${1:-3}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
round() { # NAME ROUND [--tls]
  local name=$1 i=$2
  shift 2
  for ratio in 0 1; do
    "$bin" --output json bench cluster --spawn "$out/cluster" "$@" --clients 50 --duration 10 --ops 100000000 \
      --key_size 16 --value_size 16 --keys 100000 --read_ratio "$ratio" \
      >"$out/$name-$i-$ratio.json" 2>"$out/$name-$i-$ratio.err"
  done
}
for i in $(seq 1 "$runs"); do
  if [ $((i % 2)) = 1 ]; then
    round plain "$i"
    round tls "$i" --tls
  else
    round tls "$i" --tls
    round plain "$i"
  fi
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def get(name, i, ratio):
    return json.load(open(f"{out}/{name}-{i}-{ratio}.json"))["runs"][0]
print("| | plaintext ops/s | TLS ops/s | ratio | plaintext p50 / p99 (us) | TLS p50 / p99 (us) | rounds |")
print("|---|---:|---:|---:|---|---|---|")
for ratio, what in [(0, "writes"), (1, "reads")]:
    p = [get("plain", i, ratio) for i in range(1, runs + 1)]
    t = [get("tls", i, ratio) for i in range(1, runs + 1)]
    m = lambda rs, k: statistics.median(r[k] for r in rs)
    rounds = ", ".join(f"{a['ops_per_sec']:.0f}/{b['ops_per_sec']:.0f}" for a, b in zip(p, t))
    print(f"| {what} | {m(p,'ops_per_sec'):,.0f} | {m(t,'ops_per_sec'):,.0f} | "
          f"{m(t,'ops_per_sec')/m(p,'ops_per_sec'):.2f}x | {m(p,'p50_us'):.0f} / {m(p,'p99_us'):.0f} | "
          f"{m(t,'p50_us'):.0f} / {m(t,'p99_us'):.0f} | {rounds} |")
PY
