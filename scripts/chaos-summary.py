#!/usr/bin/env python3
"""The summary table of docs/chaos/RESULTS.md, from chaos run directories.

Usage: scripts/chaos-summary.py DIR...   (each a target/chaos/<backend>-<pid> directory)

Every figure comes from what the harness wrote: `summary.txt` (its verdict, its closest handover
and lifetimes, its table of faults by kind) and `run.json`. Prints Markdown: one row per run, then
the faults by kind with their outcomes (takeovers / kept) per run. Exits with 1 if a run's
verdict is not "no violation" or a directory has no summary.
"""
import json
import re
import sys
from pathlib import Path


def parse(directory: Path) -> dict:
    summary = (directory / "summary.txt").read_text()
    lines = summary.splitlines()
    head = re.match(
        r"(\S+) chaos run: seed (\d+), ttl (\S+), (\d+) nodes, (\S+), (\d+) faults, (\d+) tenures",
        lines[0],
    )
    if not head:
        raise SystemExit(f"{directory}: cannot read the first line of summary.txt")
    backend, seed, ttl, nodes, length, faults, tenures = head.groups()
    run = {
        "dir": directory,
        "backend": backend,
        "seed": seed,
        "ttl": ttl,
        "length": length,
        "faults": int(faults),
        "tenures": int(tenures),
        "verdict": lines[1],
        "violations": 0 if lines[1].startswith("verdict: no violation") else None,
        "kinds": {},
    }
    m = re.match(r"(\d+) safety violation", lines[1])
    if m:
        run["violations"] = int(m.group(1))
    for line in lines:
        m = re.match(r"closest handover between processes: (\S+)s", line)
        if m:
            run["closest_handover"] = float(m.group(1))
        m = re.match(r"closest lifetimes: (\S+)s", line)
        if m:
            run["closest_lifetimes"] = float(m.group(1))
        m = re.match(r"(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+) \|", line)
        if m and m.group(1) != "fault":
            kind, n, met, takeovers, kept = m.groups()
            run["kinds"][kind] = (int(n), int(met), int(takeovers), int(kept))
        m = re.match(r"paused holders: (\d+), ticks or steps after the resume: (\d+)", line)
        if m:
            run["paused"] = (int(m.group(1)), int(m.group(2)))
        m = re.match(r"clock faults: .*", line)
        if m:
            run["clock"] = line
    return run


def main() -> int:
    dirs = [Path(d) for d in sys.argv[1:]]
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    runs = [parse(d) for d in dirs]
    print("| backend | seed | length | faults | met an acting holder | takeovers | kept | tenures "
          "| closest handover between processes | closest lifetimes | paused holders (ran after resume) "
          "| violations (overlaps) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        met = sum(k[1] for k in r["kinds"].values())
        takeovers = sum(k[2] for k in r["kinds"].values())
        kept = sum(k[3] for k in r["kinds"].values())
        paused = r.get("paused", (0, 0))
        violations = r["violations"] if r["violations"] is not None else "?"
        print(f"| {r['backend']} | {r['seed']} | {r['length']} | {r['faults']} | {met} | {takeovers} "
              f"| {kept} | {r['tenures']} | {r.get('closest_handover', float('nan')):.3f} s "
              f"| {r.get('closest_lifetimes', float('nan')):.3f} s | {paused[0]} ({paused[1]}) "
              f"| **{violations}** |")
    kinds = []
    for r in runs:
        for k in r["kinds"]:
            if k not in kinds:
                kinds.append(k)
    print()
    print("Faults by kind: injected / met an acting holder / takeovers / kept.")
    print()
    print("| fault | " + " | ".join(r["backend"] for r in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for k in kinds:
        cells = []
        for r in runs:
            v = r["kinds"].get(k)
            cells.append(" / ".join(map(str, v)) if v else "-")
        print(f"| {k} | " + " | ".join(cells) + " |")
    for r in runs:
        if "clock" in r:
            print(f"\n{r['backend']}: {r['clock']}")
    bad = [r for r in runs if r["violations"] != 0]
    for r in bad:
        print(f"\n{r['dir']}: {r['verdict']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
