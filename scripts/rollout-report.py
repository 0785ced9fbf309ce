#!/usr/bin/env python3
"""The rolling-update table of BENCHMARKS.md, from tests/rollout.rs's results.

Usage: scripts/rollout-report.py [FILE]   (default target/rollout/results.jsonl)

Each line of FILE is one run of `tests/rollout.rs`: a backend, a handover policy, and per rollout
the leadership changes and the leaderless time before each change. Prints a Markdown table, the
policy and no policy side by side per backend. Exits with 1 when a run with the policy had a
rollout with other than one change, or ended on an old revision.
"""
import collections
import json
import sys


def pct(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[max(0, min(len(values) - 1, int(-(-len(values) * p // 1)) - 1))]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "target/rollout/results.jsonl"
    runs = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            runs[(r["backend"], r["handover"])] = r  # the latest run of each
    status = 0
    print("| backend | policy | rollouts | changes per rollout (mean) | rollouts with 1 / 2 / 3+ changes "
          "| ended on the new revision | leaderless per change: median | p99 | max |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    for (backend, handover), r in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] == "off")):
        n = r["rollouts"]
        counts = collections.Counter(r["changes"])
        gaps = r["leaderless_ms"]
        policy = "off" if handover == "off" else f"`{handover}`"
        print(f"| {backend} | {policy} | {n} | {sum(r['changes']) / max(n, 1):.2f} | "
              f"{counts.get(1, 0)} / {counts.get(2, 0)} / {sum(v for k, v in counts.items() if k >= 3)} | "
              f"{r['ended_on_new_revision']} of {n} | {pct(gaps, 0.5):.1f} ms | {pct(gaps, 0.99):.1f} ms | "
              f"{max(gaps) if gaps else 0:.1f} ms |")
        if handover != "off" and (set(r["changes"]) != {1} or r["ended_on_new_revision"] != n):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
