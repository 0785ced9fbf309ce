#!/usr/bin/env python3
"""Where a planned move's time goes, per shard, from the logs of a sharded bench run.

`benches/sharded.rs` keeps each round's node logs in `target/bench-sharded/<backend>-<pid>-<round>/`:
the workers' events (`node-N.jsonl`: `start` and `stop` with wall-clock nanoseconds) and each
node's log (`node-N.log`). Run the bench with the Kubernetes backend's debug lines, which mark
when a release or handover request is sent:

    BENCH_RUST_LOG="actix_coordination=info,actix_coordination::kubernetes::backend=debug" \\
        BENCH_SHARDED_ROUNDS=2 cargo bench --all-features --bench sharded -- kubernetes
    python3 scripts/handover-breakdown.py target/bench-sharded/kubernetes-<pid>-*

For every handover (a `lease released, handed over` line) whose worker stopped on the leaving node
and started on the target, it prints the medians of: the leaving worker's stop -> the handover's
request sent (this crate: the manager's turn, the lease's call) -> its answer (the API server's
`PUT`), the request sent -> the target's `lease acquired` (the watch event and the take-up), and
that -> the target's worker started. Joins and shutdowns are counted alike.
"""

import glob
import json
import re
import statistics
import sys
from datetime import datetime, timezone


def wall_ms(stamp):
    """Milliseconds since the epoch of a tracing timestamp (`2026-11-27T02:30:03.170726Z`)."""
    parsed = datetime.strptime(stamp[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc)
    return parsed.timestamp() * 1e3


SENT = re.compile(r"(\S+)Z .*sending the release object=\S+?[.-](\d+) handing=true")
HANDED = re.compile(r"(\S+)Z .*lease released, handed over lease=\S+?[.-](\d+) owner=(\S+) target=(\S+)")
ACQUIRED = re.compile(r"(\S+)Z .*lease acquired lease=\S+?[.-](\d+) owner=(\S+)")


def rounds(directories):
    """(stop -> sent, sent -> answer, sent -> acquired, acquired -> start, stop -> start) per move."""
    for directory in directories:
        events = {}
        for path in glob.glob(f"{directory}/*.jsonl"):
            for line in open(path):
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                events.setdefault(event["owner"], []).append(event)
        sent, handed, acquired = {}, [], {}
        for path in glob.glob(f"{directory}/*.log"):
            owner = path.rsplit("/", 1)[-1][: -len(".log")]
            for line in open(path):
                if m := SENT.match(line):
                    sent.setdefault((owner, m[2]), []).append(wall_ms(m[1]))
                elif m := HANDED.match(line):
                    handed.append((wall_ms(m[1]), m[2], m[3], m[4]))
                elif m := ACQUIRED.match(line):
                    acquired.setdefault((m[3], m[2]), []).append(wall_ms(m[1]))

        def times(owner, kind, shard, keep):
            return [
                e["wall_ns"] / 1e6
                for e in events.get(owner, [])
                if e["event"] == kind and e["shard"] == shard and keep(e["wall_ns"] / 1e6)
            ]

        for answered, shard, owner, target in handed:
            stops = times(owner, "stop", shard, lambda t: t <= answered + 1)
            starts = times(target, "start", shard, lambda t: t >= answered - 50)
            sends = [t for t in sent.get((owner, shard), []) if t <= answered + 1]
            if not (stops and starts and sends):
                continue
            stop, send = max(stops), max(sends)
            start = min(starts)
            takes = [t for t in acquired.get((target, shard), []) if send - 1 <= t <= start + 1]
            if not takes or start - stop > 1000:
                continue
            take = min(takes)
            yield (send - stop, answered - send, take - send, start - take, start - stop)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    moves = list(rounds(sys.argv[1:]))
    if not moves:
        sys.exit("no handover found (were the debug lines on? see the usage above)")
    names = ["stop -> sent", "sent -> answer", "sent -> acquired", "acquired -> start", "stop -> start"]
    medians = [statistics.median(m[i] for m in moves) for i in range(len(names))]
    print(f"{len(moves)} handovers, medians: " + ", ".join(
        f"{name} {value:.1f} ms" for name, value in zip(names, medians)
    ))


if __name__ == "__main__":
    main()
