#!/usr/bin/env python3
"""Turns bench-log-repeat.sh output into a markdown table of medians (ops/sec)."""
import re
import statistics
import sys
from collections import defaultdict

cells = defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"rep=(\d+) writers=(\d+) value_size=(\d+) system=(\S+) ops_per_sec=(\d+)", line)
    if m:
        cells[(int(m[2]), int(m[3]), m[4])].append(int(m[5]))
print("| writers | value | phoenix q=1 | phoenix q=4 | RocksDB | best phoenix / RocksDB | runs (q1; q4; rocks) |")
print("|---:|---:|---:|---:|---:|---:|---|")
for w in (16, 64):
    for v in (16, 128, 1024, 16384):
        q1, q4, r = (cells.get((w, v, s), []) for s in ("phoenix-q1", "phoenix-q4", "rocksdb"))
        if not (q1 and q4 and r):
            continue
        mq1, mq4, mr = statistics.median(q1), statistics.median(q4), statistics.median(r)
        print(f"| {w} | {v} | {mq1:.0f} | {mq4:.0f} | {mr:.0f} | {max(mq1, mq4) / mr:.1f}x "
              f"| {q1}; {q4}; {r} |")
