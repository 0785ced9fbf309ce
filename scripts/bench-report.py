#!/usr/bin/env python3
"""Writes the tables of BENCHMARKS.md from the benches' machine-readable results.

Every bench appends one JSON line per measurement to a results file (benches/common/mod.rs):
what it measured, the targets it checked (`checks`), the command that ran it, the git commit and
the date. The results behind the committed BENCHMARKS.md are kept in benches/data/results.jsonl
(the latest line per measurement); the peer figures in benches/data/peers.json. This script
replaces the text between each pair of markers

    <!-- bench-report:NAME -->  ...  <!-- /bench-report:NAME -->

in BENCHMARKS.md with the table NAME, followed by the command, commit and date of every line
it was made from (and the headline sentence of README.md's "Measured" section, marker
`measured`). Nothing in a table is written by hand: the "met?" column comes from the checks the
benches made.

Usage:
  scripts/bench-report.py                  rewrite BENCHMARKS.md from benches/data/results.jsonl
  scripts/bench-report.py --merge FILE     first merge FILE (a bench run's results) into the
                                           data file: a measurement in FILE replaces the same
                                           measurement (bench, measurement, backend, variant)
  scripts/bench-report.py --check          exit 1 when BENCHMARKS.md differs from what the data
                                           gives (nothing is written)
  --data FILE / --out FILE / --readme-out FILE
                                           another data file / output files (scripts/bench.sh
                                           quick previews a run this way without touching the
                                           committed files)
"""

import argparse
import itertools
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "benches", "data", "results.jsonl")
PEERS = os.path.join(ROOT, "benches", "data", "peers.json")
DOC = os.path.join(ROOT, "BENCHMARKS.md")

BACKENDS = [("kubernetes", "Kubernetes"), ("etcd", "etcd"), ("memory", "in memory")]
BACKEND_NAME = dict(BACKENDS)
# Table rows: a backend on one server, and etcd on a three-member cluster as well.
ROWS = [("kubernetes", "Kubernetes", None), ("etcd", "etcd", None),
        ("etcd", "etcd, 3 members", "3 members"), ("memory", "in memory", None)]

# The reference point each table states; a line measured from another one is marked.
REFERENCE = {
    "failover": "start of the holder's last successful renewal",
    "kill": "start of the node's last successful renewal",
}


def key(r):
    return (r["bench"], r["measurement"], r["backend"], r.get("variant"))


def load(path):
    records = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if line:
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        sys.exit(f"{path}:{n}: not JSON: {e}")
    return records


def latest(records):
    """The last record of each measurement, in first-seen order."""
    out = {}
    for r in records:
        out.pop(key(r), None)
        out[key(r)] = r
    return list(out.values())


class Data:
    def __init__(self, records, peers):
        self.records = latest(records)
        self.peers = peers

    def get(self, measurement, backend, variant=None):
        for r in self.records:
            if (r["measurement"], r["backend"], r.get("variant")) == (measurement, backend, variant):
                return r
        return None

    def all(self, measurement, backend=None):
        return [
            r
            for r in self.records
            if r["measurement"] == measurement and (backend is None or r["backend"] == backend)
        ]

    def peer(self, pid):
        for p in self.peers["figures"]:
            if p["id"] == pid:
                return f"{p['value']} ([{pid}](#where-the-others-stand))"
        sys.exit(f"peer figure {pid} missing from {PEERS}")


# ---------------------------------------------------------------------------------------------
# Formatting


def num(v, digits=2):
    return f"{v:,.{digits}f}"


def ms(v, digits=2):
    return f"{v:.{digits}f} ms"


def table(header, rows, align=None):
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def sources(records, labels=None):
    """One line per distinct (command, commit, date) of the records behind a table, with the
    machine's load average (1 minute) when they were measured."""
    groups = {}
    loads = {}
    for r in records:
        if r is None:
            continue
        g = (r["command"], r["commit"], r["date"][:10], r.get("source"))
        label = (labels or {}).get(id(r)) or BACKEND_NAME.get(r["backend"], r["backend"])
        if r.get("variant") == "3 members" and label == BACKEND_NAME.get(r["backend"]):
            label += ", 3 members"

        groups.setdefault(g, [])
        if label not in groups[g]:
            groups[g].append(label)
        # The machine's load when it was measured: the 1-minute load average of each record.
        if r.get("load"):
            loads.setdefault(g, set()).add(float(str(r["load"]).split()[0]))
    lines = []
    for g, names in groups.items():
        command, commit, date, source = g
        line = f"`{command}` at commit `{commit}`, {date} ({', '.join(names)})"
        if g in loads:
            low, high = min(loads[g]), max(loads[g])
            line += f", load {low:.1f}" if low == high else f", load {low:.1f}–{high:.1f}"
        if source:
            line += f"; {source}"
        lines.append(f"- {line}")
    return (
        "<sub>Generated by `scripts/bench-report.py` from `benches/data/results.jsonl`; "
        "measured by:</sub>\n\n" + "\n".join(lines)
    )


def checks(r, *ids):
    return [c for c in (r or {}).get("checks", []) if c["id"] in ids]


def verdict(rows):
    """The "met?" cell: rows is [(backend, [check, ...])]."""
    parts, all_met = [], True
    for backend, cs in rows:
        if not cs:
            continue
        name = BACKEND_NAME[backend]
        missed = [c for c in cs if not c["met"]]
        if not missed:
            parts.append(f"{name} yes")
        elif all(c.get("known_miss") for c in missed):
            parts.append(f"**{name} no** (known miss, see below)")
            all_met = False
        else:
            parts.append(f"**{name} no**")
            all_met = False
    if not parts:
        return "–"
    return "yes" if all_met else "; ".join(parts)


def marked(r):
    """A dagger when a record was measured from another reference point than its table's."""
    want = REFERENCE.get(r["measurement"])
    return "" if not want or r.get("reference", "").startswith(want) else " †"


# ---------------------------------------------------------------------------------------------
# Tables


def t_targets(d):
    rows, used = [], []

    def row(what, target, cells_for, check_ids, measurements):
        cells, verdict_rows = [], []
        for backend, _ in BACKENDS:
            recs = [r for m in measurements for r in d.all(m, backend)]
            if measurements == ["fleet-large"]:
                # The run on an idle machine; those beside busy processes are in their section.
                recs = [r for r in recs if r.get("variant") is None]
            used.extend(recs)
            cs = [c for r in recs for c in checks(r, *check_ids)]
            cells.append(cells_for(backend, recs) if recs else "–")
            verdict_rows.append((backend, cs))
        rows.append([what, target, *cells, verdict(verdict_rows)])

    def stat(measurement, name, field, digits):
        def cell(backend, recs):
            r = d.get(measurement, backend)
            return ms(r["stats"][name][field], digits) + marked(r) if r else "–"

        return cell

    row("graceful handoff, median", "≤ 10 ms", stat("handoff", "latency", "median", 2),
        ["handoff-median"], ["handoff"])
    row("graceful handoff, p99", "≤ 50 ms", stat("handoff", "latency", "p99", 2),
        ["handoff-p99"], ["handoff"])
    row("planned transfer to a named node (`release_to`), p99", "≤ 50 ms",
        stat("transfer", "latency", "p99", 2), ["transfer-p99"], ["transfer"])
    row("crash failover beyond the TTL, p99 (SIGKILLed process)", "≤ 100 ms",
        stat("kill", "beyond_ttl", "p99", 1), ["failover-p99"], ["kill"])
    row("crash failover beyond the TTL, p99 (in-process drop)", "≤ 100 ms",
        stat("failover", "beyond_ttl", "p99", 1), ["failover-p99"], ["failover"])

    def early(backend, recs):
        recs = [r for r in recs if checks(r, "failover-never-early")]
        if not recs:
            return "–"
        crashes = sum(r["stats"]["beyond_ttl"]["n"] for r in recs)
        n = sum(c["value"] for r in recs for c in checks(r, "failover-never-early"))
        return f"{n:.0f} in {crashes} crashes"

    row("contender holding before the crashed holder's deadline", "never", early,
        ["failover-never-early"], ["failover", "kill"])

    def per_minute(field, kinds_from):
        def cell(backend, recs):
            vals = sorted({round(r["values"][field], 2) for r in recs})
            kinds = sorted({k for r in recs for k in r["values"][kinds_from]})
            text = " / ".join(num(v) for v in vals)
            return text + (f" ({', '.join(kinds)})" if kinds and field == "holder_per_minute" else "")

        return cell

    row("holder's requests per minute (renewal 10 s)", "exactly 6",
        per_minute("holder_per_minute", "holder"), ["holder-requests"], ["requests"])
    row("waiting contender's periodic requests per minute", "0",
        per_minute("contender_per_minute", "holder"), ["contender-requests"], ["requests"])

    def guard(name):
        def cell(backend, recs):
            by = {r["variant"]: r for r in recs}
            return " / ".join(
                ms(by[v]["stats"][name]["p99"]) if v in by else "–" for v in ("idle", "busy")
            )

        return cell

    row("deadline -> singleton's guard resolved, p99 (idle / busy arbiter)", "≤ 1 ms",
        guard("resolved"), ["guard-resolved-p99"], ["guard"])
    row("deadline -> singleton stopped, p99 (idle / busy arbiter)", "≤ 5 ms",
        guard("stopped"), ["guard-stopped-p99"], ["guard"])

    def frozen(backend, recs):
        r = recs[-1]
        rounds = r["values"]["rounds"]
        acts = sum(x["acts_after_sigcont"] for x in rounds)
        ticks = [x.get("ticks_after_sigcont") for x in rounds]
        stops = [x["stopped_after_sigcont_ms"] for x in rounds if x["stopped_after_sigcont_ms"] is not None]
        text = f"{acts} actions"
        if all(t is not None for t in ticks):
            text += f", {sum(ticks)} timer ticks"
        if stops:
            span = f"{min(stops):.1f}" if len(stops) == 1 else f"{min(stops):.1f}–{max(stops):.1f}"
            text += f"; singleton stopped {span} ms after `SIGCONT`"
        return text + f" ({len(rounds)} round{'s' if len(rounds) != 1 else ''})"

    row("frozen holder acting after `SIGCONT`", "never", frozen,
        ["frozen-acts", "frozen-ticks", "frozen-stopped"], ["pause"])

    row("sharded workers: per-shard handover on a planned move (SIGTERM), median", "≤ 10 ms",
        stat("shard-handover", "latency", "median", 1), ["shard-handover-median"],
        ["shard-handover"])

    row("sharded workers: per-shard handover on a planned move (SIGTERM), slowest", "≤ 100 ms",
        stat("shard-handover", "latency", "max", 1), ["shard-handover-max"],
        ["shard-handover"])

    def moves(backend, recs):
        return f"{max(recs[-1]['values']['moves']):.0f} moves (16 shards to move)"

    row("sharded workers: shards moved by a join (3 → 4 nodes, 64 shards)", "≤ 17", moves,
        ["shard-join-moves"], ["shard-join"])

    def kill_p99(backend, recs):
        r = recs[-1]
        return ms(r["stats"]["latency"]["p99"], 0) + f" (TTL {r['values']['ttl_ms'] / 1000:g} s)"

    row("sharded workers: SIGKILLed node's shards running elsewhere, p99", "≤ TTL + 1 s",
        kill_p99, ["shard-kill-p99"], ["shard-kill"])

    def idle(backend, recs):
        v = recs[-1]["values"]
        return (f"{num(v['renewals_per_minute'])} renewals, {num(v['other_per_minute'])} other"
                + (f", {v['watch_opens']:.0f} watch opened" if backend == "kubernetes" else ""))

    row("sharded workers: idle member's requests per minute (renewal 10 s), on its own server",
        "6 renewals, 0 other", idle,
        ["idle-member-renewals", "idle-member-other", "idle-member-watch-opens"], ["idle-member"])

    def lost(backend, recs):
        v = recs[-1]["values"]
        return f"{v['lost']} lost, {v['wrong_nodes']} nodes off {v['shards'] // v['nodes']}"

    row("sharded workers: 8 processes × 1,024 shards held 60 s: shards lost, nodes off 128",
        "0, 0", lost, ["fleet-lost", "fleet-nodes"], ["fleet"])

    def memory(backend, recs):
        return f"{recs[-1]['values']['memory_per_shard_bytes'] / 1000:.1f} KB"

    row("sharded workers: memory per held shard (8 processes × 1,024 shards)", "≤ 64 KB", memory,
        ["fleet-memory-per-shard"], ["fleet"])

    # The large fleet (`benches/fleet.rs`, scenario `large`): 16 × 4,096 unless a run says else.
    def large(cell):
        def f(backend, recs):
            return cell(recs[-1]["values"], recs[-1].get("stats", {}))
        return f

    def size(v):
        return f"{v['nodes']} × {v['shards']:,}"

    row("sharded workers: 16 processes × 4,096 shards, lease writes per renewal interval "
        "(the server's own counters)", "≤ 1.2 × nodes (19.2)",
        large(lambda v, s: f"{v['steady']['writes_per_interval']:.1f} "
              f"({size(v)}, {v['ttl_s']} s / {v['renewal_s']} s)"),
        ["large-writes-per-interval"], ["fleet-large"])
    row("sharded workers: 16 processes × 4,096 shards held: shards lost, nodes off 256", "0, 0",
        large(lambda v, s: f"{v['steady']['lost']} lost, {v['steady']['wrong_nodes']} nodes off "
              f"{v['shards'] // v['nodes']} ({v['steady']['window_s']:.0f} s)"),
        ["large-lost", "large-nodes"], ["fleet-large"])
    row("sharded workers: memory per held shard (16 processes × 4,096 shards)", "≤ 64 KB",
        large(lambda v, s: f"{v['steady']['memory_per_shard_bytes'] / 1000:.1f} KB"),
        ["large-memory-per-shard"], ["fleet-large"])
    row("sharded workers: SIGKILLed node's shards running elsewhere, slowest (16 × 4,096)",
        "≤ TTL + 1 s",
        large(lambda v, s: f"{ms(s['kill']['max'], 0)} (TTL {v['ttl_s']} s, "
              f"{v['kill']['shards']} shards)"),
        ["large-kill-max"], ["fleet-large"])
    row("sharded workers: SIGTERMed node's shards running elsewhere, slowest (16 × 4,096)",
        "≤ 100 ms",
        large(lambda v, s: f"{ms(s['term']['max'], 0)} ({v['term']['shards']} shards)"),
        ["large-term-max"], ["fleet-large"])
    row("sharded workers: shards moved by a join (16 → 17 nodes, 4,096 shards)", "≤ 241",
        large(lambda v, s: f"{v['join']['moves']} moves ({v['join']['to_joiner']} to the joiner)"),
        ["large-join-moves"], ["fleet-large"])

    def scale(backend, recs):
        return "; ".join(
            f"{r['values']['leases']:,} held ({r['variant']}), {r['values']['lost']} lost"
            for r in recs
        )

    row("one process holding many leases, none lost", "1,000 / 10,000 / 100,000", scale,
        ["scale-lost", "scale-alive", "scale-expired"], ["scale"])

    header = ["what", "target", "Kubernetes", "etcd", "in memory", "met?"]
    return table(header, rows) + "\n\n" + sources(used)


def t_peers(d):
    rows = []
    for p in d.peers["figures"]:
        rows.append([p["id"], p["peer"], p["what"], p["value"], f"[{p['source']}](#peer-sources)"])
    out = table(["id", "peer", "what", "figure", "source"], rows)
    out += "\n\n<a id=\"peer-sources\"></a>Sources (`benches/data/peers.json`):\n\n"
    out += "\n".join(
        f"- `{name}`: {s['what']} Setup: {s['setup']}." for name, s in d.peers["sources"].items()
    )
    return out


def t_handoff(d):
    rows, used = [], []
    for backend, name, variant in ROWS:
        r = d.get("handoff", backend, variant)
        if not r:
            continue
        used.append(r)
        s, rel = r["stats"]["latency"], r["stats"]["release"]
        rows.append([
            name, s["n"], ms(s["min"]), f"**{ms(s['median'])}**", ms(s["p99"]), ms(s["max"]),
            ms(rel["median"]), d.peer("P1") if backend == "kubernetes" else "–",
        ])
    header = ["backend", "n", "min", "median", "p99", "max", "`release()` call itself (median)", "client-go"]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---"]
    return table(header, rows, align) + "\n\n" + sources(used)


def t_failover(d):
    rows, used, dagger = [], [], False
    for backend, name, variant in ROWS:
        for m, crash in (("kill", "SIGKILL"), ("failover", "in-process drop")):
            r = d.get(m, backend, variant)
            if not r:
                continue
            used.append(r)
            s = r["stats"]["beyond_ttl"]
            mark = marked(r)
            dagger |= bool(mark)
            rows.append([
                name, crash + mark, s["n"], ms(s["min"], 1), f"**{ms(s['median'], 1)}**",
                f"**{ms(s['p99'], 1)}**", ms(s["max"], 1),
                d.peer("P2") if backend == "kubernetes" and m == "kill" else "",
            ])
    header = ["backend", "crash", "n", "min", "median", "p99", "max", "client-go"]
    align = ["---", "---", "---:", "---:", "---:", "---:", "---:", "---"]
    out = table(header, rows, align)
    if dagger:
        refs = {}
        for r in used:
            if marked(r):
                refs.setdefault(r["reference"], []).append(f"{BACKEND_NAME[r['backend']]} {r['measurement']}")
        out += (
            "\n\n† Not measured from this table's reference point but "
            + "; ".join(f"{ref} ({', '.join(rows)})" for ref, rows in refs.items())
            + ": biased low, not comparable with the other rows; to be rerun."
        )
    return out + "\n\n" + sources(used)


def t_requests(d):
    rows, used = [], []

    def fmt(counters, rate):
        if not counters:
            return "0"
        kinds = ", ".join(sorted(counters))
        return f"{num(rate)} / min ({kinds})"

    for backend, name in BACKENDS:
        for r in d.all("requests", backend):
            used.append(r)
            v = r["values"]
            window = v["window_s"]
            both_rate = sum(v["holder_and_contender"].values()) * 60 / window
            rows.append([
                name, f"{v['ttl_s']} s / {v['renewal_s']} s", f"{window} s",
                "**" + fmt(v["holder"], v["holder_per_minute"]) + "**",
                fmt(v["holder_and_contender"], both_rate),
                f"**{num(v['contender_per_minute'])}**",
                f"{60 / v['renewal_s']:.0f}; 0",
            ])
    header = ["backend", "TTL / renewal", "window", "holder alone", "holder + waiting contender",
              "contender (difference)", "target"]
    return table(header, rows) + "\n\n" + sources(used)


def t_pause(d):
    rows, used = [], []
    for backend, name in BACKENDS:
        r = d.get("pause", backend)
        if not r:
            continue
        used.append(r)
        rounds = r["values"]["rounds"]
        ticks = [x.get("ticks_after_sigcont") for x in rounds]
        rows.append([
            name,
            len(rounds),
            " / ".join(f"{x['takeover_after_sigstop_ms'] / 1000:.2f}" for x in rounds) + " s",
            "**" + " / ".join(str(x["acts_after_sigcont"]) for x in rounds) + "**",
            " / ".join(str(t) for t in ticks) if all(t is not None for t in ticks) else "not recorded",
            " / ".join(
                f"{x['stopped_after_sigcont_ms']:.1f}" if x["stopped_after_sigcont_ms"] is not None else "never"
                for x in rounds
            ) + " ms",
        ])
    header = ["backend", "rounds", "contender holds after `SIGSTOP`", "old holder's actions after `SIGCONT`",
              "its timer ticks after `SIGCONT`", "its singleton stopped after `SIGCONT`"]
    return table(header, rows) + "\n\n" + sources(used)


SHARDED_VARIANTS = [None, "2 busy processes", "6 busy processes"]


def t_sharded(d):
    rows, used = [], []
    for (backend, name), variant in itertools.product(BACKENDS, SHARDED_VARIANTS):
        h, j, k = (d.get(m, backend, variant) for m in ("shard-handover", "shard-join", "shard-kill"))
        if not (h and j and k):
            continue
        used += [h, j, k]
        hs, js, ks = (r["stats"]["latency"] for r in (h, j, k))
        load = float(str(h.get("load", "0")).split()[0])
        machine = f"{variant or 'nothing else'}, load {load:.1f}"
        rows.append([
            name, machine, h["values"]["rounds"], hs["n"], ms(hs["min"], 1), f"**{ms(hs['median'], 1)}**",
            ms(hs["p99"], 1), ms(hs["max"], 1),
            f"{ms(js['median'], 0)} (max {ms(js['max'], 0)})",
            " / ".join(f"{m:.0f}" for m in j["values"]["moves"]),
            f"{ms(ks['median'], 0)} / **{ms(ks['p99'], 0)}**",
        ])
    header = ["backend", "beside it (load)", "rounds", "handovers", "min", "median", "p99", "max",
              "join → balance, median", "moves per join", "SIGKILL → running elsewhere, median / p99"]
    align = ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---:"]
    return table(header, rows, align) + "\n\n" + sources(used)


def t_fleet(d):
    rows, used = [], []
    # Shard leases bound to the member lease (the default since issue 37), then the same fleet
    # with every shard lease renewed on its own (`sharded_node --renew-shards`), measured before.
    runs = [(backend, name, None) for backend, name in BACKENDS]
    runs.insert(1, ("kubernetes", "Kubernetes, shards renewed one by one", "renewed shards"))
    for backend, name, variant in runs:
        r = d.get("fleet", backend, variant)
        if not r:
            continue
        if backend == "kubernetes" and variant is None:
            name = "Kubernetes, shards bound to the member lease"
        used.append(r)
        v = r["values"]
        rss = sorted(v["rss_bytes"])
        reqs = ", ".join(f"{k.removeprefix('received ')} {x:.1f}"
                         for k, x in sorted(v["server_requests_per_s"].items())
                         if not k.startswith("started ") and x >= 0.05) or "–"
        server = v.get("server_cpu_percent")
        rows.append([
            name, f"{v['nodes']} × {v['shards']:,}", f"{v['ttl_s']} s / {v['renewal_s']} s",
            f"{v['settle_s']:.1f} s ({v['starts_to_settle']:,} starts)", f"{v['window_s']:.0f} s",
            f"**{v['lost']}**", f"**{v['wrong_nodes']}**",
            f"{rss[0] / 1e6:.1f}–{rss[-1] / 1e6:.1f} MB", f"{v['idle_rss_bytes'] / 1e6:.1f} MB",
            f"**{v['memory_per_shard_bytes'] / 1000:.1f} KB**",
            f"{v['per_group_shard_per_node_bytes'] / 1000:.1f} KB / {v['per_held_shard_extra_bytes'] / 1000:.1f} KB"
            f" (alone with 1,024: {v['solo_rss_bytes'] / 1e6:.1f} MB)",
            f"{v['nodes_cpu_percent']:.0f} %", f"{server:.0f} %" if server is not None else "–",
            reqs, f"{v['load_at_start']} → {v['load_at_end']}",
        ])
    header = ["backend", "nodes × shards", "TTL / renewal", "all running, 128 per node, after",
              "window", "shards lost", "nodes off 128", "RSS per node", "idle member's RSS",
              "memory per held shard", "split: every shard of the group, in each node / holding it",
              "nodes' CPU (8 together, of one core)",
              "server's CPU", "server's requests / s in the window (etcd: messages)", "load average"]
    align = ["---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---",
             "---:", "---:", "---", "---"]
    out = table(header, rows, align)
    rows = []
    for backend, name in BACKENDS:
        r = d.get("idle-member", backend)
        if not r:
            continue
        used.append(r)
        v = r["values"]
        # etcd: the messages received (a call's or a stream's opening is its first message).
        fmt = lambda c: ", ".join(
            f"{k.removeprefix('received ')} {x:.0f}" for k, x in sorted(c.items())
            if not k.startswith("started ")
        ) or "nothing"
        opened = lambda c: ", ".join(
            f"{k.removeprefix('started ')} {x:.0f}" for k, x in sorted(c.items())
            if k.startswith("started ")
        )
        rows.append([
            name, v["method"], f"{v['ttl_s']} s / {v['renewal_s']} s", f"{v['window_s']:.0f} s",
            fmt(v["window"]) + (f" (opened: {opened(v['window'])})" if opened(v["window"]) else ""),
            f"**{num(v['renewals_per_minute'])}**",
            f"**{num(v['other_per_minute'])}**",
            f"{v['watch_opens']:.0f}" if backend == "kubernetes" else "–",
            fmt(v["setup"]), f"{v['cpu_s'] * 1000 / v['window_s'] * 60:.0f} ms / min",
            v["load_at_start"],
        ])
    header = ["backend", "the idle member's own server", "TTL / renewal", "window",
              "counted by that server in the window (etcd: messages received)", "renewals / min", "other requests / min",
              "watches opened", "its setup (before the window)", "its CPU", "load average"]
    out += "\n\n" + table(header, rows)
    return out + "\n\n" + sources(used)


def runs_by_backend(d, measurement):
    """Per backend: the run without a variant (an idle machine), then its variants."""
    return [r for backend, _ in BACKENDS
            for r in sorted(d.all(measurement, backend),
                            key=lambda r: (r.get("variant") is not None, r.get("variant") or ""))]


def missed(r, *ids):
    """The mark of a figure whose check of `r` among `ids` missed its target, else nothing."""
    cs = checks(r, *ids)
    return "" if all(c["met"] for c in cs) else " (**missed**)"


def t_fleet_large(d):
    """Issue 37's fleet of real processes (`benches/fleet.rs`, scenario `large`)."""
    # Per backend: the run on an idle machine, then those beside busy processes (`BENCH_BUSY`).
    recs = runs_by_backend(d, "fleet-large")
    if not recs:
        return "(no results yet)"
    met = missed

    def phase_cost(c):
        """What a phase cost until balanced: CPU and the server's requests (its mean time)."""
        if not c:
            return "–"
        server = c.get("server_cpu_s")
        reqs = ", ".join(
            f"{k.removeprefix('received ')} {x:.0f}"
            + (f" ({c['server_mean_ms'][k]:.0f} ms)" if k in c.get("server_mean_ms", {}) else "")
            for k, x in sorted(c.get("server_requests", {}).items())
            if k not in ("WATCH", "LIST") and not k.startswith("started ") and x >= 0.5
        )
        return (f"{c['wall_s']:.1f} s: nodes {c['nodes_cpu_s']:.1f} s of CPU, server "
                + (f"{server:.1f} s" if server is not None else "–")
                + (f"; {reqs}" if reqs else ""))

    def others_started(phase):
        n = phase["other_starts"]
        return f"; {n} other shards started" if n else ""

    steady, changes = [], []
    for r in recs:
        v, st, s = r["values"], r["values"]["steady"], r["stats"]
        name = BACKEND_NAME[r["backend"]] + (f" ({r['variant']})" if r.get("variant") else "")
        rss = sorted(st["rss_bytes"])
        per_node = v["shards"] // v["nodes"]
        writes = ", ".join(f"{k.removeprefix('received ')} {x:.0f}"
                           for k, x in sorted(st["writes"].items())) or "none"
        others = ", ".join(f"{k.removeprefix('received ')} {x:.0f}"
                           for k, x in sorted(st["server_requests"].items())
                           if k not in st["writes"] and not k.startswith("started "))
        server = st.get("server_cpu_percent")
        load = v["load"]
        steady.append([
            name, f"{v['nodes']} × {v['shards']:,}", f"{v['ttl_s']} s / {v['renewal_s']} s",
            v["server"], f"{v['settle_s']:.1f} s ({v['starts_to_settle']:,} starts)",
            f"{st['window_s']:.0f} s ({st['intervals']:.1f} intervals)",
            f"**{st['writes_per_interval']:.1f}**{met(r, 'large-writes-per-interval')} "
            f"({writes}{'; not writes: ' + others if others else ''})",
            f"**{st['lost']}**{met(r, 'large-lost')}", f"**{st['wrong_nodes']}**{met(r, 'large-nodes')}",
            f"{rss[0] / 1e6:.1f}–{rss[-1] / 1e6:.1f} MB", f"{st['idle_rss_bytes'] / 1e6:.1f} MB",
            f"**{st['memory_per_shard_bytes'] / 1000:.1f} KB**{met(r, 'large-memory-per-shard')}",
            f"{st['nodes_cpu_percent']:.0f} %", f"{server:.0f} %" if server is not None else "–",
            f"{load['window_start']} → {load['window_end']}",
        ])
        j, k, t = v["join"], v["kill"], v["term"]
        changes.append([
            name, f"{v['nodes']} × {v['shards']:,}", f"{v['ttl_s']} s / {v['renewal_s']} s",
            f"**{j['moves']}**{met(r, 'large-join-moves')} of at most {j['quota']} "
            f"({j['to_joiner']} to the joiner); balanced after {j['ms'] / 1000:.1f} s",
            f"{k['shards']} shards: {ms(s['kill']['median'], 0)} / "
            f"**{ms(s['kill']['max'], 0)}**{met(r, 'large-kill-max')}"
            + others_started(k),
            f"{t['shards']} shards: {ms(s['term']['median'], 0)} / "
            f"**{ms(s['term']['max'], 0)}**{met(r, 'large-term-max')}"
            + others_started(t),
            f"{ms(s['term_downtime']['median'], 0)} / {ms(s['term_downtime']['max'], 0)}",
            (f"{t['last_stop_ms']:.0f} ms" if t.get("last_stop_ms") is not None else "–"),
            phase_cost(t.get("cpu")),
            f"{load['join']} / {load['kill']} / {load['term']}",
        ])
    header = ["backend", "nodes × shards", "TTL / renewal", "the nodes' server",
              "all running, balanced, after", "window",
              "writes counted by the server per renewal interval (in the window, by verb)",
              "shards lost", "nodes off their count", "RSS per node", "idle member's RSS",
              "memory per held shard", "nodes' CPU (all, of one core)", "server's CPU",
              "load average (window)"]
    align = ["---", "---", "---", "---", "---:", "---:", "---", "---:", "---:", "---:", "---:",
             "---:", "---:", "---:", "---"]
    header2 = ["backend", "nodes × shards", "TTL / renewal",
               "join of one more node: worker starts (target: its quota)",
               "SIGKILL → running elsewhere, per shard: median / slowest (target TTL + 1 s)",
               "SIGTERM → running elsewhere, per shard: median / slowest (target 100 ms)",
               "SIGTERM: each shard's stop there → its start elsewhere, median / slowest",
               "SIGTERM → the leaving node's last worker stopped",
               "SIGTERM until balanced: the other nodes' CPU, the server's; its requests (its mean time)",
               "load average (join / kill / term)"]
    return (table(header, steady, align) + "\n\n" + table(header2, changes) + "\n\n"
            + sources(recs))


def t_fleet_start(d):
    """Issue 48's start of a fleet at once (`benches/fleet.rs`, scenario `start`)."""
    recs = runs_by_backend(d, "fleet-start")
    if not recs:
        return "(no results yet)"
    met = missed

    rows = []
    for r in recs:
        v = r["values"]
        name = BACKEND_NAME[r["backend"]] + (f" ({r['variant']})" if r.get("variant") else "")
        reqs = ", ".join(f"{k.removeprefix('received ')} {x:.0f}"
                         for k, x in sorted(v["requests"].items())
                         if not k.startswith("started ") and x >= 0.5)
        rows.append([
            name, f"{v['nodes']} × {v['shards']:,}", f"{v['ttl_s']} s / {v['renewal_s']} s",
            str(v["max_claims_in_flight"]),
            f"**{v['all_running_ms'] / 1000:.1f} s**{met(r, 'start-all-running')}",
            f"{v['settle_s']:.1f} s", f"{v['worker_starts']:,}",
            f"**{v['members_lost']}**{met(r, 'start-members-lost')}",
            f"{v['bound_refused']}", f"**{v['not_rising']}**{met(r, 'start-tokens-rising')}",
            reqs, f"{v['load']['before']} → {v['load']['after']}",
        ])
    header = ["backend", "nodes × shards", "TTL / renewal", "claims in flight per node",
              "every shard running after (target 10 s)", "balanced after", "worker starts",
              "member tenures lost (target 0)", "claims refused: member lease not held",
              "shards whose tokens did not rise (target 0)", "the server's requests until balanced",
              "load average"]
    return table(header, rows) + "\n\n" + sources(recs)


def t_guard(d):
    rows, used = [], []
    for variant in ("idle", "busy"):
        r = d.get("guard", "memory", variant)
        if not r:
            continue
        used.append(r)
        g, s = r["stats"]["resolved"], r["stats"]["stopped"]
        rows.append([
            variant, g["n"], ms(g["min"]), ms(g["median"]), f"**{ms(g['p99'])}**", ms(g["max"]),
            ms(s["min"]), ms(s["median"]), f"**{ms(s['p99'])}**", ms(s["max"]),
        ])
    header = ["arbiter", "n", "guard resolved: min", "median", "p99", "max",
              "singleton stopped: min", "median", "p99", "max"]
    align = ["---"] + ["---:"] * 9
    labels = {id(r): f"{r['variant']} arbiter" for r in used}
    return table(header, rows, align) + "\n\n" + sources(used, labels)


def t_scale(d):
    rows, used = [], []
    for backend, name in (("memory", "in memory"), ("etcd", "etcd"), ("kubernetes", "Kubernetes")):
        for r in d.all("scale", backend):
            used.append(r)
            v = r["values"]
            server = ", ".join(
                f"{label} {pct:.1f} % of a core" for label, pct in v.get("server_cpu_percent", {}).items()
            ) or "–"
            rows.append([
                name, f"{v['leases']:,}", f"{v['ttl_s']:g} s / {v['renewal_s']:g} s", f"{v['acquire_s']:.2f} s",
                f"{v['memory_per_lease_bytes'] / 1000:.1f} KB"
                + (f" (heap {v['heap_per_lease_bytes'] / 1000:.1f} KB)" if "heap_per_lease_bytes" in v else ""),
                f"{v['cpu_us_per_lease_renewal']:.1f} µs",
                server, f"**{v['lost']}**", ms(v["worst_renewal_lateness_ms"], 1),
                num(v["keep_alives_per_min"]) if v.get("keep_alives_per_min") is not None else "–",
                f"**{v['keep_alives_per_interval']:.2f}**" if v.get("keep_alives_per_interval") is not None else "–",
                str(v["connections_established_max"]) if "connections_established_max" in v else "–",
            ])
    header = ["backend", "leases", "TTL / renewal", "acquire all", "memory per lease",
              "client CPU per lease-renewal", "server CPU", "lost", "worst renewal lateness",
              "keep-alives / min (all leases, sent)", "keep-alives per renewal interval (received by etcd)",
              "connections to the API server"]
    align = ["---", "---:", "---", "---:", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:"]
    labels = {id(r): f"{BACKEND_NAME[r['backend']]} {r['variant']}" for r in used}
    return table(header, rows, align) + "\n\n" + sources(used, labels)


THROUGHPUT = [
    ("in_memory/acquire+release/trait", "`acquire` + `release` through the `Lease` trait", "pairs"),
    ("in_memory/acquire+release/actor", "`acquire` + `release` through the `LeaseActor` mailbox", "pairs"),
    ("in_memory/check_alive", "`check_alive`", ""),
]


def t_throughput(d):
    rows, used = [], []
    for variant, what, unit in THROUGHPUT:
        r = d.get("throughput", "memory", variant)
        if not r:
            continue
        used.append(r)
        ns = r["values"]["ns_per_iteration"]
        per_s = r["values"]["per_second"]
        time = f"{ns / 1000:.3f} µs" if ns >= 1000 else f"{ns:.1f} ns"
        rate = f"{per_s / 1e6:.0f} million" if per_s >= 1e7 else f"{round(per_s, -3):,.0f}"
        rows.append([what, time, f"{rate} {unit}".strip()])
    labels = {id(r): r["variant"] for r in used}
    return table(["what", "time per operation", "per second"], rows, ["---", "---:", "---:"]) + "\n\n" + sources(used, labels)


PLACEMENT = [
    ("placement/10000x100/members-changed",
     "the members changed (a join or a leave): the ideal assignment anew, then the holders"),
    ("placement/10000x100/holders-changed",
     "only a holder changed (a claim, a handover): the ideal assignment kept"),
    ("placement/10000x100/sorted-pairs",
     "for comparison, what every change cost before: building and sorting the 1 M pairs alone"),
]


def t_placement(d):
    rows, used = [], []
    for variant, what in PLACEMENT:
        r = d.get("placement", "memory", variant)
        if not r:
            continue
        used.append(r)
        ns = r["values"]["ns_per_iteration"]
        rows.append([what, f"{ns / 1e6:.1f} ms"])
    labels = {id(r): r["variant"] for r in used}
    return table(["10,000 shards over 100 members", "time per placement"], rows, ["---", "---:"]) + "\n\n" + sources(used, labels)


def t_simulation(d):
    """Issue 37's simulation (`benches/simulation.rs`): one line per fleet size."""
    recs = [r for r in d.all("simulation", "memory")]
    if not recs:
        return "(no results yet)"
    rows, mem = [], []
    for r in recs:
        v, x = r["values"], r["values"]["result"]
        n, s = v["nodes"], v["shards"]
        ok = {c["id"]: c["met"] for c in r["checks"]}

        def met(*ids):
            return "yes" if all(ok.get(i) for i in ids) else "**no**"

        def cost(p):
            c = x[p]
            med, top = c["reconcile_per_node_median"], c["reconcile_per_node_max"]
            return [
                f"{c['virtual_s']:.1f} s",
                f"{c['wall_s']:.1f} s (CPU {c['cpu_s']:.1f} s)",
                f"{med['count']:,} in {med['ms']:,.0f} ms / {top['count']:,} in {top['ms']:,.0f} ms",
                (f"{c['reconcile_call_median_ms']:.3f} ms / {c['reconcile_call_p90_ms']:.3f} ms"
                 if "reconcile_call_median_ms" in c else "–"),
            ]

        size = f"{n} × {s:,}"
        q = (s // (n + 1), -(-s // (n + 1)))
        rows += [
            [size, f"start ({n} nodes at once)" if not v.get("start_spread_ms") else
             f"start (one node every {v['start_spread_ms'] / n:.0f} ms)",
             (f"{x['low']} shards on every node" if x["low"] == x["high"]
              else f"{x['low']}–{x['high']} shards per node"), "±1 (⌊S/N⌋ or ⌈S/N⌉)",
             met("sim-spread", "sim-overlaps"), *cost("start")],
            [size, f"steady, {v['intervals']} renewal intervals",
             f"{x['per_interval']:.2f} writes per interval ({x['writes']} in all), {x['steady_moved']} moved",
             f"= {n} (the member renewals)", met("sim-writes-per-interval", "sim-steady-moved"),
             *cost("steady")],
            [size, f"join of node {n + 1}", f"{x['join_moved']} moved, all to the joiner",
             f"its quota, {q[0]} or {q[1]}", met("sim-join-moved", "sim-join-quota", "sim-join-to-joiner"),
             *cost("join")],
            [size, "graceful leave (`Shutdown`)", f"{x['leave_moved']} moved",
             f"exactly its {x['leaver_held']}", met("sim-leave-moved", "sim-leave-exact"), *cost("leave")],
            [size, "crash (the store never answers it again)",
             f"{x['crash_moved']} moved, all running {x['crash_beyond_ttl_ms']:.0f} ms after its member lease expired",
             f"exactly its {x['crashed_held']}", met("sim-crash-moved", "sim-crash-exact", "sim-overlaps"),
             *cost("crash")],
        ]
        grown = x["rss_settled"] - x["rss_empty"]
        one = x["steady_one_reconcile_ms"]
        mem.append([
            size,
            f"{x['rss_empty'] / 1e6:.1f} MB → {x['rss_settled'] / 1e6:.1f} MB",
            f"{grown / n / 1e6:.2f} MB" + (f" (its group view: {x['view_bytes'] / 1e6:.2f} MB)" if "view_bytes" in x else ""),
            f"{grown / s / 1e3:.1f} KB",
            f"{one:.2f} ms",
            f"{one * n:.0f} ms ({one * n / (v['renewal_s'] * 1e3) * 100:.2f} % of a core)",
            str(x["overlaps"]),
        ])
    header = ["nodes × shards", "phase", "result", "target", "met?", "on the fleet's clock",
              "real time (whole fleet)", "reconciles per node: median node / busiest node",
              "one reconcile (CPU): median / p90, all nodes"]
    mem_header = ["nodes × shards", "process RSS: empty → settled", "per node", "per shard",
                  "one reconcile that changes nothing (median node)",
                  "per node and renewal interval, renewals spread (N × that)", "overlaps"]
    labels = {id(r): r["variant"] for r in recs}
    return (
        table(header, rows, ["---", "---", "---", "---", "---", "---:", "---:", "---:", "---:"])
        + "\n\n"
        + table(mem_header, mem, ["---", "---:", "---:", "---:", "---:", "---:", "---:"])
        + "\n\n"
        + sources(recs, labels)
    )
def t_group_watch(d):
    """The group watch at 10,000 shards (benches/group_watch.rs): one column per backend."""
    runs = [(name, d.get("group_watch", backend, "10000x100")) for backend, name in
            (("kubernetes", "Kubernetes"), ("etcd", "etcd"))]
    runs = [(name, r) for name, r in runs if r]
    if not runs:
        return "(not measured yet)"
    lat = lambda s: f"{s['median']:.2f} ms (p99 {s['p99']:.1f} ms)"
    rows = [
        ("objects in the group (shards + members)",
         lambda r: f"{r['values']['objects']:,} ({r['values']['shards']:,} + {r['values']['members']})"),
        ("`watch_group` to the first synced snapshot",
         lambda r: f"{r['values']['list_ms']:.0f} ms"
         + (f", {r['values']['list_requests']} list requests" if r["values"].get("list_requests") is not None
            else ", one range request")),
        ("memory per object: resident (heap in use)",
         lambda r: f"{r['values']['rss_per_object_bytes']:,.0f} B ({r['values']['heap_per_object_bytes']:,.0f} B)"),
        ("a write of one record → `changed()` shows it, median", lambda r: lat(r["stats"]["delivery"])),
        ("the same, the reader holding the previous snapshot", lambda r: lat(r["stats"]["delivery_reader_holding"])),
        ("the write's own round trip", lambda r: lat(r["stats"]["write"])),
        ("`GroupSnapshot::live_holder` of a shard (Kubernetes: bound, its member record read too)", lambda r: f"{r['values']['live_holder_ns']:.0f} ns"),
        ("full scan (`live_holder` of every record)", lambda r: f"{r['values']['scan_ms']:.2f} ms"),
        ("a copy of the snapshot", lambda r: f"{r['values']['copy_ms']:.2f} ms"),
    ]
    body = [[what] + [f(r) for _, r in runs] for what, f in rows]
    header = ["10,000 shards × 100 members, one session"] + [name for name, _ in runs]
    used = [r for _, r in runs]
    return table(header, body, ["---"] + ["---:"] * len(runs)) + "\n\n" + sources(used)


ROUTING = [
    ("routing/plain", "a plain handler, no middleware (the baseline)"),
    ("routing/routed/here", "through `ShardRouting`, the shard on this node: served (the handler takes `RoutedShard`)"),
    ("routing/routed/redirect", "through `ShardRouting`, the shard on the other node: `307` to its address"),
]
LOCATE = [
    ("routing/locate_entity/10000/here", "the shard on this node"),
    ("routing/locate_entity/10000/elsewhere", "the shard on the other node (its address read too)"),
]
MOVES = [
    ("join", "a join: `b` joins, `a` hands it half the shards (4 at a time)"),
    ("shutdown", "`Shutdown` of `b`: its shards freed in one write, `a` claims them"),
]


def t_routing(d):
    """Issue 38's routing bench (benches/routing.rs): per request, and the 503 window per move."""
    used = []
    base = d.get("routing", "memory", ROUTING[0][0])
    rows = []
    for variant, what in ROUTING:
        r = d.get("routing", "memory", variant)
        if not r:
            continue
        used.append(r)
        v = r["values"]
        median = v["median_ns"] / 1000
        diff = "–" if r is base or not base else f"{median - base['values']['median_ns'] / 1000:+.2f} µs"
        rows.append([what, f"{median:.2f} µs", f"{v['median_ci_low_ns'] / 1000:.2f}–{v['median_ci_high_ns'] / 1000:.2f} µs", diff])
    out = []
    if rows:
        out.append(table(["one request (`test::init_service`, no socket)", "median", "its 95 % interval", "vs. the baseline"],
                         rows, ["---", "---:", "---:", "---:"]))
    rows = []
    for variant, what in LOCATE:
        r = d.get("routing", "memory", variant)
        if not r:
            continue
        used.append(r)
        v = r["values"]
        rows.append([what, f"{v['median_ns']:.0f} ns"])
    if rows:
        out.append(table(["`ShardDirectory::locate_entity` alone, 10,000 shards over 2 nodes", "median"], rows,
                         ["---", "---:"]))
    rows = []
    for variant, what in MOVES:
        r = d.get("routing_move", "memory", variant)
        if not r:
            continue
        used.append(r)
        v, st = r["values"], r["stats"]
        w, g, p = st["window"], st["gap"], st["poll_round"]
        old = st.get("old_owner_503")
        rows.append([
            what,
            f"{v['moves']} ({v['expected_moves']})",
            f"{w['median']:.2f} / {w['p99']:.2f} / **{w['max']:.2f} ms**",
            f"{v['without_503']} of {v['moves']}",
            f"{g['median']:.2f} / {g['max']:.2f} ms",
            f"{old['median']:.2f} / {old['max']:.2f} ms ({old['n']})" if old else "never seen",
            f"{v['back_and_forth']} of {v['moves']}",
            f"{p['median']:.2f} / {p['p99']:.2f} ms",
            str(v["served_by_both"]),
        ])
    if rows:
        out.append(table(
            ["move (32 shards, 2 nodes, in memory, real clock)", "moves seen (expected)",
             "503 window per move: median / p99 / max", "moves without a 503 seen",
             "no node serving it: median / max", "old owner's 503 until it redirects: median / max (moves)",
             "moves in which the new owner sent a client back",
             "polling round: median / p99", "served by both at once"],
            rows, ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]))
    if not out:
        return "(not measured yet)"
    labels = {id(r): r["variant"] for r in used}
    return "\n\n".join(out) + "\n\n" + sources(used, labels)


METRICS_OVERHEAD = [
    ("renewal", "one renewal (timer, store call, deadline; with the feature also its four metrics)"),
    ("check_alive", "`check_alive` (records nothing by design)"),
]


def t_metrics(d):
    rows, used = [], []
    for path, what in METRICS_OVERHEAD:
        off = d.get("metrics_overhead", "memory", f"metrics/{path}/feature-off")
        on = d.get("metrics_overhead", "memory", f"metrics/{path}/feature-on")
        if not off or not on:
            continue
        used += [off, on]
        a, b = off["values"]["ns_per_iteration"], on["values"]["ns_per_iteration"]
        fmt = lambda ns: f"{ns / 1000:.3f} µs" if ns >= 1000 else f"{ns:.1f} ns"
        rows.append([what, fmt(a), fmt(b), f"{b - a:+.0f} ns ({(b - a) / a * 100:+.1f} %)"])
    labels = {id(r): r["variant"] for r in used}
    header = ["what", "feature off", "feature on (Prometheus recorder)", "difference"]
    return table(header, rows, ["---", "---:", "---:", "---:"]) + "\n\n" + sources(used, labels)


def t_readme_measured(d):
    """The headline sentence of the README's "Measured" section."""
    parts = []
    h = d.get("handoff", "kubernetes")
    if h:
        s = h["stats"]["latency"]
        missed = [
            what
            for cid, what in (("handoff-median", "the median its 10 ms"), ("handoff-p99", "the p99 its 50 ms"))
            if any(c["id"] == cid and not c["met"] for c in h["checks"])
        ]
        note = ""
        if missed:
            note = f" ({' and '.join(missed)} target missed, see [BENCHMARKS.md](BENCHMARKS.md))"
        parts.append(
            f"Graceful handoff on the real kube-apiserver: {s['median']:.1f} ms median, "
            f"{s['p99']:.0f} ms p99{note}"
        )
    kill, drop = d.get("kill", "kubernetes"), d.get("failover", "kubernetes")
    if kill and not marked(kill):
        parts.append(
            f"a SIGKILLed holder replaced {kill['stats']['beyond_ttl']['median']:.0f} ms (median) after its TTL"
        )
    elif drop:
        parts.append(
            f"a crashed holder (dropped in process) replaced "
            f"{drop['stats']['beyond_ttl']['median']:.0f} ms (median) after its TTL"
        )
    reqs = d.all("requests", "kubernetes")
    if reqs:
        holder = sorted({round(r["values"]["holder_per_minute"], 2) for r in reqs})
        contender = max(abs(r["values"]["contender_per_minute"]) for r in reqs)
        parts.append(
            f"{' / '.join(f'{v:g}' for v in holder)} requests a minute for a holder renewing every 10 s and "
            + ("none" if contender < 1e-9 else f"{contender:.2f}")
            + " for a waiting contender"
        )
    pauses = [r for b, _ in BACKENDS for r in d.all("pause", b)]
    if pauses:
        rounds = [x for r in pauses for x in r["values"]["rounds"]]
        acts = sum(x["acts_after_sigcont"] for x in rounds)
        parts.append(
            f"a frozen holder never acted after it was resumed ({len(rounds)} freezes)"
            if acts == 0
            else f"**a frozen holder acted {acts} times after it was resumed**"
        )
    used = [h, kill, drop, *reqs, *pauses]
    return (
        "; ".join(parts)
        + ". Every figure is checked against its target by the bench that measures it "
        + "(`--check`), and [BENCHMARKS.md](BENCHMARKS.md#what-backs-each-claim) names the bench or "
        + "test behind each number of this README. "
        + "`scripts/bench.sh` reruns everything (this sentence is generated from "
        + "`benches/data/results.jsonl`: commits "
        + ", ".join(sorted({f"`{r['commit']}`" for r in used if r}))
        + ")."
    )


TABLES = {
    "targets": t_targets,
    "peers": t_peers,
    "handoff": t_handoff,
    "failover": t_failover,
    "requests": t_requests,
    "pause": t_pause,
    "sharded": t_sharded,
    "fleet": t_fleet,
    "fleet_large": t_fleet_large,
    "fleet_start": t_fleet_start,
    "guard": t_guard,
    "scale": t_scale,
    "throughput": t_throughput,
    "placement": t_placement,
    "simulation": t_simulation,
    "group_watch": t_group_watch,
    "routing": t_routing,
    "metrics": t_metrics,
}

README_TABLES = {"measured": t_readme_measured}
README = os.path.join(ROOT, "README.md")


def render(doc, d, tables=TABLES, what="BENCHMARKS.md"):
    for name, make in tables.items():
        start, end = f"<!-- bench-report:{name} -->", f"<!-- /bench-report:{name} -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if not pattern.search(doc):
            sys.exit(f"{what} has no {start} ... {end} markers")
        body = make(d)
        doc = pattern.sub(lambda _: f"{start}\n{body}\n{end}", doc)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--merge", action="append", default=[], metavar="FILE")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--out", default=DOC)
    ap.add_argument("--readme-out", default=README)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    records = load(args.data)
    merged = 0
    for path in args.merge:
        new = load(path)
        if not new:
            sys.exit(f"{path}: no results")
        records += new
        merged += len(new)
    records = latest(records)
    with open(PEERS, encoding="utf-8") as f:
        peers = json.load(f)
    data = Data(records, peers)
    outputs = []
    for source, target, tables in ((DOC, args.out, TABLES), (README, args.readme_out, README_TABLES)):
        with open(source, encoding="utf-8") as f:
            outputs.append((target, render(f.read(), data, tables, os.path.basename(source))))

    if args.check:
        stale = []
        for target, text in outputs:
            with open(target, encoding="utf-8") as f:
                if f.read() != text:
                    stale.append(target)
        if stale:
            sys.exit(f"{', '.join(stale)}: not what {args.data} gives: run scripts/bench-report.py")
        return
    if merged:
        with open(args.data, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
        print(f"{args.data}: {merged} results merged, {len(records)} measurements")
    for target, text in outputs:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{target}: generated parts written")


if __name__ == "__main__":
    main()
