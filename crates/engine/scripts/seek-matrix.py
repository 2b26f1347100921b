#!/usr/bin/env python3
"""Summarizes seek-matrix.sh output: median ops/sec per cell for each engine, the ratio,
and the smallest cell ratio. Usage: seek-matrix.py OUT"""
import re
import statistics
import sys
from collections import defaultdict

cells = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"seek v=(\d+) t=(\d+) n=(\d+) variant=(\w+) rep=\d+ (phoenix|rocksdb) .* (\d+) ops/sec", line)
    if not m:
        continue
    v, t, n, variant, engine, ops = m.groups()
    cells[(variant, int(v), int(t), int(n))][engine].append(int(ops))

print("| variant | value B | threads | --seek_nexts | PhoenixKV ops/s | RocksDB ops/s | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
worst = None
for key in sorted(cells, key=lambda k: (["plain", "bounded", "prefix"].index(k[0]), k[1], k[2], k[3])):
    c = cells[key]
    if not c["phoenix"] or not c["rocksdb"]:
        continue
    p, r = statistics.median(c["phoenix"]), statistics.median(c["rocksdb"])
    ratio = p / r
    worst = ratio if worst is None else min(worst, ratio)
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {p:,.0f} | {r:,.0f} | {ratio:.2f}x |")
if worst is not None:
    print(f"\nsmallest ratio: {worst:.2f}x over {len(cells)} cells")
