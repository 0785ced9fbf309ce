#!/usr/bin/env python3
"""A graceful handoff between two real `singleton_node` processes on the test cluster's kube-apiserver.

Each trial starts node A (it takes a fresh lease), then node B (it waits on its watch), waits
0.5-1.5 s (`--wait-min`, `--wait-max`), SIGTERMs A and measures until B's singleton started: the
nodes' `--events` lines are stamped with CLOCK_MONOTONIC, the clock this script reads when it
sends the signal (commits before the events had `wall_ns` stamped `t_ns` with the wall clock;
the script then uses the wall clock). With the backend's debug lines (the default RUST_LOG), it
also breaks each handoff down from the nodes' log timestamps (wall clock): A's signal, its
singleton stopped, its release sent (`sending the release`) and answered (`lease released`);
B's watch event (only with `actix_coordination::kubernetes::watch=trace`), its claim sent
(`sending the claim`), answered (`lease acquired`) and its singleton started.

    . target/test-cluster/env     # scripts/test-cluster.sh up
    cargo build --release --features kubernetes --example singleton_node
    scripts/process-handoff.py --bin target/release/examples/singleton_node --trials 10 --out DIR \
        --rust-log actix_coordination=debug,actix_coordination::kubernetes::watch=trace

Prints one line per trial, then the median / min / max, the 1-minute load before and after and
the mean WAL fsync and backend commit of the API server's etcd over the batch (from its
/metrics), then the median of each mark; `--jsonl FILE` appends the batch as one JSON line.
A commit can be measured from a second worktree's build: copy its binary aside and pass `--bin`.
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

RUST_LOG = "actix_coordination=debug"


def etcd_disk(url):
    """(fsync count, fsync seconds, commit count, commit seconds) of the API server's etcd."""
    import urllib.request
    if not url:
        return None
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    want = ["etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_wal_fsync_duration_seconds_sum",
            "etcd_disk_backend_commit_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_sum"]
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            vals[parts[0]] = float(parts[1])
    return [vals.get(w, 0.0) for w in want]


def load():
    return float(open("/proc/loadavg").read().split()[0])


def wall_ms(stamp):
    parsed = datetime.strptime(stamp[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc)
    return parsed.timestamp() * 1e3


def events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


def wait_for(path, event, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in events(path):
            if e["event"] == event:
                return e
        time.sleep(0.002)
    return None


# Log lines (tracing's fmt: `2026-11-27T02:30:03.170726Z  INFO target: message fields`).
STAMP = re.compile(r"^(\S+Z)\s+(\w+)\s+(.*)$")
MARKS = [
    ("signal", "termination signal received"),
    ("shutdown", "singleton manager shutting down"),
    ("stopped", "singleton stopped"),
    ("release_sent", "sending the release"),
    ("released", "lease released"),
]
B_MARKS = [
    ("watch_event", "lease watch event"),
    ("claim_sent", "sending the claim"),
    ("acquired", "lease acquired"),
    ("started", "singleton started"),
]


def marks(log, table, since=0.0):
    found = {}
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    with open(log) as f:
        for line in f:
            line = ansi.sub("", line)
            m = STAMP.match(line)
            if not m:
                continue
            for name, text in table:
                at = wall_ms(m.group(1))
                if name not in found and text in m.group(3) and at >= since:
                    found[name] = at
    return found


def config(path, env, ttl, renewal):
    token = os.path.join(os.path.dirname(path), "token")
    with open(token, "w") as f:
        f.write(env["ACTIX_COORD_TEST_K8S_TOKEN"])
    with open(path, "w") as f:
        f.write(
            f'[leases.singleton]\nbackend = "kubernetes"\nttl = "{ttl}"\nrenewal-interval = "{renewal}"\n\n'
            f'[leases.singleton.kubernetes]\nnamespace = "{env["ACTIX_COORD_TEST_K8S_NAMESPACE"]}"\n'
            f'api-url = "{env["ACTIX_COORD_TEST_K8S_URL"]}"\ntoken-file = "{token}"\n'
            f'ca-file = "{env["ACTIX_COORD_TEST_K8S_CA"]}"\n'
        )


def spawn(args, out, cfg, lease, owner):
    ev = os.path.join(out, f"{lease}-{owner}.jsonl")
    log = open(os.path.join(out, f"{lease}-{owner}.log"), "w")
    env = dict(os.environ, RUST_LOG=args.rust_log, NO_COLOR="1")
    proc = subprocess.Popen(
        [args.bin, "--config", cfg, "--lease", lease, "--owner", owner, "--events", ev] + args.extra.split(),
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    return proc, ev, log.name


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def trial(args, cfg, n):
    lease = f"handoff-{os.getpid()}-{n}"
    a, a_ev, a_log = spawn(args, args.out, cfg, lease, "node-a")
    b = None
    try:
        if not wait_for(a_ev, "start", 20):
            raise RuntimeError(f"{lease}: A did not start")
        b, b_ev, b_log = spawn(args, args.out, cfg, lease, "node-b")
        time.sleep(random.uniform(args.wait_min, args.wait_max))
        if wait_for(b_ev, "start", 0):
            raise RuntimeError(f"{lease}: B started while A held")
        wall0 = time.time_ns() / 1e6
        t0 = time.monotonic_ns()
        a.send_signal(signal.SIGTERM)
        start = wait_for(b_ev, "start", 20)
        if not start:
            raise RuntimeError(f"{lease}: B did not start after A's SIGTERM")
        a.wait(10)
        # Before CLOCK_MONOTONIC events (older commits), `t_ns` was the wall clock.
        total = (start["t_ns"] - t0) / 1e6 if "wall_ns" in start else start["t_ns"] / 1e6 - wall0
        time.sleep(0.05)
        ma, mb = marks(a_log, MARKS, wall0 - 1), marks(b_log, B_MARKS, wall0 - 1)
        stop_ev = [e for e in events(a_ev) if e["event"] == "stop"]
        rel = {k: round(v - wall0, 2) for k, v in {**ma, **mb}.items()}
        if stop_ev:
            e = stop_ev[0]
            rel["stop_event"] = round((e["t_ns"] - t0) / 1e6 if "wall_ns" in e else e["t_ns"] / 1e6 - wall0, 2)
        return total, rel
    finally:
        stop(a)
        if b:
            stop(b)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="")
    p.add_argument("--ttl", default="6s")
    p.add_argument("--renewal", default="2s")
    p.add_argument("--rust-log", default=RUST_LOG)
    p.add_argument("--wait-min", type=float, default=0.5, help="seconds B waits before A is stopped (min)")
    p.add_argument("--wait-max", type=float, default=1.5)
    p.add_argument("--extra", default="", help="more arguments of both nodes (whitespace-separated)")
    p.add_argument("--jsonl", help="append a result line here")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = os.path.join(args.out, "config.toml")
    config(cfg, os.environ, args.ttl, args.renewal)
    load0 = load()
    disk0 = etcd_disk(os.environ.get("ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT"))
    totals, rows = [], []
    for n in range(args.trials):
        total, rel = trial(args, cfg, n)
        totals.append(total)
        rows.append(rel)
        print(f"{args.label} trial {n}: {total:.2f} ms  " + " ".join(f"{k}={v}" for k, v in sorted(rel.items(), key=lambda kv: kv[1])), flush=True)
    load1 = load()
    disk1 = etcd_disk(os.environ.get("ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT"))
    disk = ""
    if disk0 and disk1:
        d = [b - a for a, b in zip(disk0, disk1)]
        disk = f"; etcd wal fsync mean {1e3 * d[1] / max(d[0], 1):.2f} ms, backend commit mean {1e3 * d[3] / max(d[2], 1):.2f} ms"
    med = statistics.median(totals)
    print(f"{args.label}: n={len(totals)} median {med:.2f} ms, min {min(totals):.2f}, max {max(totals):.2f}; load {load0:.2f} -> {load1:.2f}{disk}")
    keys = sorted({k for r in rows for k in r})
    print("  medians (ms after SIGTERM): " + ", ".join(
        f"{k} {statistics.median([r[k] for r in rows if k in r]):.2f}" for k in sorted(keys, key=lambda k: statistics.median([r[k] for r in rows if k in r]))))
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(json.dumps({"label": args.label, "totals": totals, "rows": rows, "load": [load0, load1], "etcd_disk": [disk0, disk1]}) + "\n")


if __name__ == "__main__":
    main()
