#!/usr/bin/env python3
"""A handoff as seen through the metrics: draws docs/handoff-metrics.svg from a real run.

Three processes of examples/web_service.rs share one lease on the real etcd of the test cluster.
Every 50 ms this script scrapes each one's /metrics (the Prometheus text a Prometheus server
would scrape) and /leases. At 4 s it sends SIGTERM to the leader (a graceful handoff: the lease is
released and another node takes over within a round trip); at 10 s it sends SIGKILL to the next
leader (a crash: the others wait for the TTL). The picture shows, per process, when
`actix_coordination_lease_held` was 1, the deadline margin of its renewals
(`renewal_margin_seconds`: sum and count deltas between two scrapes), and the fencing token of
each tenure from /leases.

Run it with the test cluster's environment:

    scripts/test-cluster.sh run -- python3 scripts/handoff-metrics.py [OUT.svg]
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "handoff-metrics.svg")
TTL, RENEWAL = 4.0, 1.0
DURATION, TERM_AT, KILL_AT = 17.0, 4.0, 10.0
NODES = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=0.5) as r:
            return r.read().decode()
    except Exception:
        return None


def metric(text, name, lease):
    """The value of `name{lease="..."}` (no other labels) in a Prometheus text exposition."""
    m = re.search(rf'^{re.escape(name)}\{{lease="{re.escape(lease)}"\}} (\S+)$', text or "", re.M)
    return float(m.group(1)) if m else None


def main():
    endpoint = os.environ.get("ACTIX_COORD_TEST_ETCD_ENDPOINT")
    if not endpoint:
        sys.exit("run it under scripts/test-cluster.sh run -- ... (needs ACTIX_COORD_TEST_ETCD_ENDPOINT)")
    subprocess.run(
        ["cargo", "build", "--all-features", "--example", "web_service"], cwd=ROOT, check=True
    )
    binary = os.path.join(ROOT, "target", "debug", "examples", "web_service")
    lease = f"handoff-metrics-{os.getpid()}"
    tmp = tempfile.mkdtemp()
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as f:
        f.write(
            f'[leases.singleton]\nbackend = "etcd"\nttl = "{TTL:g}s"\nrenewal-interval = "{RENEWAL:g}s"\n\n'
            f'[leases.singleton.etcd]\nendpoints = ["{endpoint}"]\nprefix = "/handoff-metrics/{os.getpid()}/"\n'
        )
    nodes = []
    for i in range(NODES):
        port = free_port()
        log = open(os.path.join(tmp, f"node-{i + 1}.log"), "w")
        child = subprocess.Popen(
            [binary, "--config", config, "--lease", lease, "--owner", f"node-{i + 1}",
             "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        nodes.append({"name": f"node-{i + 1}", "port": port, "child": child, "samples": []})
        time.sleep(0.3)  # start in order, so node-1 leads first
    deadline = time.time() + 30
    while any(get(n["port"], "/healthz") is None for n in nodes):
        if time.time() > deadline:
            sys.exit("the services did not come up")
        time.sleep(0.05)

    events = []
    start = time.time()
    termed = killed = None
    try:
        while (now := time.time() - start) < DURATION:
            for n in nodes:
                if n["child"].poll() is not None:
                    continue
                text = get(n["port"], "/metrics")
                leases = get(n["port"], "/leases")
                report = next((r for r in json.loads(leases or "[]") if r["name"] == lease), {})
                n["samples"].append({
                    "t": time.time() - start,
                    "held": metric(text, "actix_coordination_lease_held", lease),
                    "margin_sum": metric(text, "actix_coordination_renewal_margin_seconds_sum", lease),
                    "margin_count": metric(text, "actix_coordination_renewal_margin_seconds_count", lease),
                    "token": report.get("fencing_token"),
                })
            leader = next((n for n in nodes if n["child"].poll() is None and n["samples"]
                           and n["samples"][-1]["held"] == 1), None)
            if termed is None and now >= TERM_AT and leader:
                leader["child"].send_signal(signal.SIGTERM)
                termed = leader
                events.append((time.time() - start, f"SIGTERM {leader['name']}"))
            elif killed is None and termed and now >= KILL_AT and leader and leader is not termed:
                leader["child"].send_signal(signal.SIGKILL)
                killed = leader
                events.append((time.time() - start, f"SIGKILL {leader['name']}"))
            time.sleep(0.05)
    finally:
        for n in nodes:
            if n["child"].poll() is None:
                n["child"].send_signal(signal.SIGTERM)
        for n in nodes:
            try:
                n["child"].wait(timeout=15)
            except subprocess.TimeoutExpired:
                n["child"].kill()
    draw(nodes, events)
    print(f"{OUT}: written ({sum(len(n['samples']) for n in nodes)} scrapes)")


def draw(nodes, events):
    width, left, right, lane, top = 1000, 80, 20, 110, 50
    height = top + lane * len(nodes) + 60
    x = lambda t: left + (width - left - right) * t / DURATION
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">A handoff seen through the '
        f'metrics: three web_service processes, one lease on etcd (TTL {TTL:g} s, renewal every '
        f'{RENEWAL:g} s)</text>',
        f'<text x="10" y="38" fill="#555">green: lease_held = 1 on /metrics (scraped every 50 ms), '
        f'with the fencing token from /leases; dots: renewal_margin_seconds per renewal (0 to TTL, '
        f'bottom to top)</text>',
    ]
    for i, n in enumerate(nodes):
        y0 = top + i * lane + 10
        h = lane - 30
        out.append(f'<text x="10" y="{y0 + h / 2 + 4}" font-weight="bold">{n["name"]}</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{width - left - right}" height="{h}" '
                   f'fill="#f4f4f4" stroke="#ccc"/>')
        samples = n["samples"]
        # Held intervals.
        run = None
        for j, s in enumerate(samples):
            held = s["held"] == 1
            end = j == len(samples) - 1
            if held and run is None:
                run = (s["t"], s["token"])
            if run is not None and (not held or end):
                t1 = s["t"]
                out.append(f'<rect x="{x(run[0]):.1f}" y="{y0}" width="{max(x(t1) - x(run[0]), 1):.1f}" '
                           f'height="{h}" fill="#7bc87b" opacity="0.6"/>')
                out.append(f'<text x="{x(run[0]) + 4:.1f}" y="{y0 + 14}" fill="#1b5e20">token '
                           f'{run[1]}</text>')
                run = None
        # Renewal margins: mean of the renewals between two scrapes.
        for a, b in zip(samples, samples[1:]):
            if None in (a["margin_count"], b["margin_count"], a["margin_sum"], b["margin_sum"]):
                continue
            dc = b["margin_count"] - a["margin_count"]
            if dc > 0:
                margin = (b["margin_sum"] - a["margin_sum"]) / dc
                cy = y0 + h - h * min(margin / TTL, 1)
                out.append(f'<circle cx="{x(b["t"]):.1f}" cy="{cy:.1f}" r="3" fill="#1565c0"/>')
        if samples:
            last = samples[-1]["t"]
            if n["child"].returncode not in (None, 0):
                out.append(f'<text x="{x(last) + 3:.1f}" y="{y0 + h - 4}" fill="#b71c1c">killed</text>')
    # How long after each event another process reported lease_held = 1.
    for k, (t, label) in enumerate(events):
        taken = min(
            (s["t"] for n in nodes for s in n["samples"]
             if s["t"] > t and s["held"] == 1 and not label.endswith(n["name"])),
            default=None,
        )
        if taken is not None:
            events[k] = (t, f"{label} at {t:.1f} s: next leader after {taken - t:.2f} s")
    for t, label in events:
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{top + lane * len(nodes)}" '
                   f'stroke="#b71c1c" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{x(t) + 3:.1f}" y="{top + lane * len(nodes) + 14}" fill="#b71c1c">'
                   f'{label}</text>')
    for s in range(0, int(DURATION) + 1, 2):
        out.append(f'<text x="{x(s):.1f}" y="{height - 12}" text-anchor="middle" fill="#555">{s} s</text>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
