#!/usr/bin/env python3
"""Summarizes bench-vs-rocksdb.sh output: per cell and benchmark, the median ops/sec of
each system and the median of the per-repetition ratios PhoenixKV / RocksDB."""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(dict)  # (value, threads, wal, bench) -> {rep: {sys: ops}}
hdr = None
for line in open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin:
    m = re.match(r"## rep=(\d+) value=(\d+) threads=(\d+) disable_wal=(\d) system=(\w+)", line)
    if m:
        hdr = m.groups()
        continue
    m = re.match(r"(\w+)\s+:\s+[\d.]+ micros/op (\d+) ops/sec", line)
    if m and hdr:
        rep, value, threads, wal, system = hdr
        runs[(int(value), int(threads), wal, m.group(1))].setdefault(rep, {})[system] = int(m.group(2))

order = ["fillseq", "fillrandom", "overwrite", "readrandom", "readseq", "seekrandom"]
print("| values | threads | WAL | benchmark | PhoenixKV ops/s | RocksDB ops/s | ratio (median) | ratios |")
print("|---|---|---|---|---:|---:|---:|---|")
worst = {}
for key in sorted(runs, key=lambda k: (k[0], k[1], k[2], order.index(k[3]) if k[3] in order else 99)):
    value, threads, wal, bench = key
    reps = [r for r in runs[key].values() if "phoenix" in r and "rocksdb" in r]
    if not reps:
        continue
    ratios = [r["phoenix"] / r["rocksdb"] for r in reps]
    p = statistics.median(r["phoenix"] for r in reps)
    q = statistics.median(r["rocksdb"] for r in reps)
    med = statistics.median(ratios)
    walname = "off" if wal == "1" else "on, no sync"
    print(f"| {value} B | {threads} | {walname} | {bench} | {p:.0f} | {q:.0f} | {med:.2f} | "
          + ", ".join(f"{x:.2f}" for x in ratios) + " |")
    if bench in ("fillrandom", "overwrite", "readrandom", "readseq"):
        worst[key] = med
if worst:
    k = min(worst, key=worst.get)
    print(f"\nlowest median ratio on the bar's benchmarks: {worst[k]:.2f} ({k})")
