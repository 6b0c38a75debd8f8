#!/usr/bin/python3
"""The sampler, verdict and plots of bench/soak.sh (docs/soak.md).

  soak.py sample --launchers FILE --start EPOCH --mode MODE --out CSV [--every S] [--stop FILE]
      Every S seconds (default 10) until FILE exists: for each node process (a `chorus node
      ... --id N` child of a launcher whose pid is a line of the launchers FILE, read anew at
      every sample since restarts add launchers), append one CSV row: time since EPOCH, mode,
      node id, pid, resident set (VmRSS, kB), open file descriptors, TCP sockets it holds
      established and in any other state (listening, closing), threads.
  soak.py verdict --csv CSV [--events CSV] [--warmup-min M] [--plot PNG] [--title T]
      Per node and per process life: the growth of RSS, fds and established connections from
      minute M of that life (default 5) to its end, and a verdict: flat or growing. Prints a
      Markdown table and the verdict line; exits 0 when every node is flat, 1 when one grows.
      With --plot, draws RSS, fds and connections against time, one line per node, crashes and
      rejoins marked.
  soak.py ports --count N
      Prints a base port B such that B..B+N-1 are free on loopback, below the kernel's
      ephemeral range (where no dialer's local port lands), for `chorus topo gen --base-port`.
  soak.py check --csv CSV --nodes N [--events CSV] [--crashes K] [--rejoin-logs DIR]
      The sanity check of the short form (the CTest): every node sampled, numbers plausible,
      at least K crashes, each followed by a new process of that node whose log shows a
      completed rejoin.

Only the standard library, plus matplotlib for --plot (Debian's python3-matplotlib).
"""

import argparse
import csv
import os
import statistics
import sys
import time

FIELDS = ["time_s", "mode", "node", "pid", "rss_kb", "fds", "tcp_established", "tcp_other",
          "threads"]

# A node is flat when, from minute M of a process's life to its end, its resident set grew by
# at most this much (the larger of the two), its fds by at most FD_SLACK and its established
# connections by at most CONN_SLACK. The slack covers what a healthy node does: glibc's arenas
# settle within a few MB, and a peer whose connection is being re-made when the window ends
# adds or takes one socket.
RSS_SLACK_KB = 8 * 1024
RSS_SLACK_FRACTION = 0.05
FD_SLACK = 2
CONN_SLACK = 1
# Readings averaged at each end of the window, so that one reading taken during a catch-up
# or an evaluation does not decide the verdict.
EDGE_SAMPLES = 3


def tcp_states():
    """inode -> state (hex string, '01' = ESTABLISHED) of every TCP socket in this namespace."""
    states = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9:
                        states[parts[9]] = parts[3]
        except OSError:
            pass
    return states


def children_of(parents):
    """pid -> parent pid for every process whose parent is in `parents`."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after it follow the
        # last ')'.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid in parents:
            out[int(entry)] = ppid
    return out


def node_id(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    for i in range(len(args) - 1):
        if args[i] == b"--id":
            return int(args[i + 1])
    return None


def reading(pid, states):
    """(rss_kb, fds, tcp_established, tcp_other, threads) of a live process, or None."""
    rss = threads = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    if rss is None:  # a zombie
        return None
    established = other = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            state = states.get(target[8:-1])
            if state == "01":
                established += 1
            elif state is not None:
                other += 1
    return rss, len(fds), established, other, threads


def read_launchers(path):
    try:
        with open(path) as f:
            return {int(line) for line in f if line.strip().isdigit()}
    except OSError:
        return set()


def sample(args):
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        out = csv.writer(f)
        if new:
            out.writerow(FIELDS)
            f.flush()
        next_at = time.time()
        while not (args.stop and os.path.exists(args.stop)):
            now = time.time()
            states = tcp_states()
            for pid in sorted(children_of(read_launchers(args.launchers))):
                node = node_id(pid)
                if node is None:
                    continue
                r = reading(pid, states)
                if r is None:
                    continue
                out.writerow([f"{now - args.start:.1f}", args.mode, node, pid, *r])
            f.flush()
            next_at += args.every
            # Sleep in short steps so that the stop file ends the sampler within a second.
            while time.time() < next_at and not (args.stop and os.path.exists(args.stop)):
                time.sleep(min(1.0, max(0.0, next_at - time.time())))
    return 0


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["time_s"] = float(r["time_s"])
        for k in ("node", "pid", "rss_kb", "fds", "tcp_established", "tcp_other", "threads"):
            r[k] = int(r[k])
    return rows


def load_events(path):
    if not path or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["time_s"] = float(r["time_s"])
        r["node"] = int(r["node"])
    return rows


def lives(rows):
    """(node, pid) -> that process's readings in time order."""
    out = {}
    for r in rows:
        out.setdefault((r["node"], r["pid"]), []).append(r)
    for series in out.values():
        series.sort(key=lambda r: r["time_s"])
    return out


def growth(series, warmup_s):
    """Growth of each measure over a life from warmup_s after its first reading to its last,
    each end the mean of EDGE_SAMPLES readings; None when the life is too short for a window."""
    begin = series[0]["time_s"] + warmup_s
    window = [r for r in series if r["time_s"] >= begin]
    if len(window) < 2 * EDGE_SAMPLES:
        return None
    head, tail = window[:EDGE_SAMPLES], window[-EDGE_SAMPLES:]

    def mean(part, key):
        return statistics.fmean(r[key] for r in part)

    return {
        "from_s": head[0]["time_s"],
        "to_s": tail[-1]["time_s"],
        "rss_from_kb": mean(head, "rss_kb"),
        "rss_to_kb": mean(tail, "rss_kb"),
        "rss_peak_kb": max(r["rss_kb"] for r in window),
        "fds_from": mean(head, "fds"),
        "fds_to": mean(tail, "fds"),
        "conn_from": mean(head, "tcp_established"),
        "conn_to": mean(tail, "tcp_established"),
    }


def flat(g):
    rss_limit = max(RSS_SLACK_KB, RSS_SLACK_FRACTION * g["rss_from_kb"])
    reasons = []
    if g["rss_to_kb"] - g["rss_from_kb"] > rss_limit:
        reasons.append(f"RSS +{(g['rss_to_kb'] - g['rss_from_kb']) / 1024:.1f} MB")
    if g["fds_to"] - g["fds_from"] > FD_SLACK:
        reasons.append(f"fds +{g['fds_to'] - g['fds_from']:.1f}")
    if g["conn_to"] - g["conn_from"] > CONN_SLACK:
        reasons.append(f"connections +{g['conn_to'] - g['conn_from']:.1f}")
    return reasons


def plot(rows, events, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    measures = [("rss_kb", "RSS, MB", 1 / 1024), ("fds", "open fds", 1),
                ("tcp_established", "established TCP connections", 1)]
    cmap = plt.get_cmap("tab20")
    nodes = sorted({r["node"] for r in rows})
    by_life = lives(rows)
    for (key, label, scale), ax in zip(measures, axes):
        for i, node in enumerate(nodes):
            # One line per process life, in the node's color: a restart is a new line.
            labeled = False
            for (n, _), series in sorted(by_life.items(), key=lambda kv: kv[1][0]["time_s"]):
                if n != node:
                    continue
                ax.plot([r["time_s"] / 60 for r in series], [r[key] * scale for r in series],
                        color=cmap(i % 20), linewidth=0.9,
                        label=f"node {node}" if key == "rss_kb" and not labeled else None)
                labeled = True
        for e in events:
            ax.axvline(e["time_s"] / 60, color="red" if e["event"] == "crash" else "green",
                       linestyle=":", linewidth=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(ncol=8, fontsize=6, loc="lower right")
    axes[-1].set_xlabel("minutes (red: kill -9 of a node, green: its restart with --rejoin)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def verdict(args):
    rows = load(args.csv)
    events = load_events(args.events)
    if not rows:
        print(f"soak.py: no readings in {args.csv}", file=sys.stderr)
        return 2
    warmup_s = args.warmup_min * 60
    print("| node | life from (min) | window (min) | RSS MB: from -> to (peak) | fds | "
          "connections | verdict |")
    print("| ---: | ---: | --- | --- | --- | --- | --- |")
    growing, judged, short = [], 0, 0
    for (node, pid), series in sorted(lives(rows).items(),
                                      key=lambda kv: (kv[0][0], kv[1][0]["time_s"])):
        g = growth(series, warmup_s)
        if g is None:
            short += 1
            continue
        judged += 1
        reasons = flat(g)
        if reasons:
            growing.append(f"node {node} (pid {pid}): {', '.join(reasons)}")
        print(f"| {node} | {series[0]['time_s'] / 60:.1f} | {g['from_s'] / 60:.1f}-"
              f"{g['to_s'] / 60:.1f} | {g['rss_from_kb'] / 1024:.1f} -> "
              f"{g['rss_to_kb'] / 1024:.1f} ({g['rss_peak_kb'] / 1024:.1f}) | "
              f"{g['fds_from']:.0f} -> {g['fds_to']:.0f} | {g['conn_from']:.0f} -> "
              f"{g['conn_to']:.0f} | {'growing: ' + ', '.join(reasons) if reasons else 'flat'} |")
    if args.plot:
        plot(rows, events, args.plot, args.title or os.path.basename(args.csv))
    mode = rows[0]["mode"]
    print()
    note = f" ({short} process life/lives shorter than the warm-up plus a window left out)" \
        if short else ""
    if judged == 0:
        print(f"verdict {mode}: no process lived past the {args.warmup_min:g}-minute warm-up: "
              f"nothing to judge{note}")
        return 2
    if growing:
        print(f"verdict {mode}: GROWING after the {args.warmup_min:g}-minute warm-up: "
              + "; ".join(growing) + note)
        return 1
    print(f"verdict {mode}: FLAT after the {args.warmup_min:g}-minute warm-up: {judged} process "
          f"life/lives judged, none grew beyond max({RSS_SLACK_KB // 1024} MB, "
          f"{RSS_SLACK_FRACTION:.0%}) RSS, {FD_SLACK} fds, {CONN_SLACK} connection{note}")
    return 0


def check(args):
    """The short form's sanity check: every problem is printed, exit 1 if any."""
    rows = load(args.csv)
    events = load_events(args.events)
    problems = []
    nodes = {r["node"] for r in rows}
    if nodes != set(range(args.nodes)):
        problems.append(f"sampled nodes {sorted(nodes)}, expected 0..{args.nodes - 1}")
    for r in rows:
        if not (1024 <= r["rss_kb"] <= 64 * 1024 * 1024):
            problems.append(f"implausible RSS {r['rss_kb']} kB: {r}")
        if not (3 <= r["fds"] <= 100000):
            problems.append(f"implausible fd count {r['fds']}: {r}")
        if r["tcp_established"] > 2 * args.nodes + 8:
            problems.append(f"more connections than a {args.nodes}-node mesh holds: {r}")
    times = sorted({r["time_s"] for r in rows})
    if len(times) < 3:
        problems.append(f"only {len(times)} sampling time(s)")
    # Connected at some point: each node held a connection to a peer.
    for node in nodes:
        if max(r["tcp_established"] for r in rows if r["node"] == node) < 1:
            problems.append(f"node {node} never held an established connection")
    crashes = [e for e in events if e["event"] == "crash"]
    if args.crashes and len(crashes) < args.crashes:
        problems.append(f"{len(crashes)} crash event(s), expected {args.crashes}")
    for e in crashes:
        before = {r["pid"] for r in rows if r["node"] == e["node"] and r["time_s"] < e["time_s"]}
        after = {r["pid"] for r in rows if r["node"] == e["node"] and r["time_s"] > e["time_s"]}
        if not before:
            problems.append(f"node {e['node']} was not sampled before its crash")
        if not after - before:
            problems.append(f"no new process of node {e['node']} was sampled after its crash "
                            f"at {e['time_s']:.0f} s (did --rejoin start?)")
    # Each restart took up the running job: its log says so (consensus: "rejoining: took node
    # J's model", PS: "rejoined: K key(s) restored").
    if args.rejoin_logs:
        import glob
        logs = sorted(glob.glob(os.path.join(args.rejoin_logs, "rejoin-*.log")))
        if len(logs) < len(crashes):
            problems.append(f"{len(logs)} restart log(s) for {len(crashes)} crash(es)")
        for log in logs:
            with open(log, errors="replace") as f:
                text = f.read()
            if "rejoining: took node" not in text and "rejoined: " not in text:
                problems.append(f"{log} shows no completed rejoin")
    for p in problems:
        print(f"soak.py check: {p}", file=sys.stderr)
    if not problems:
        print(f"soak.py check: {len(rows)} readings of {len(nodes)} nodes at {len(times)} times, "
              f"{len(crashes)} crash(es) each followed by a restarted process: sane")
    return 1 if problems else 0


def ports(args):
    import random
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except OSError:
        ephemeral_low = 32768
    rng = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        base = rng.randrange(10000, ephemeral_low - args.count)
        held = []
        try:
            for port in range(base, base + args.count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            print(base)
            return 0
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    print(f"soak.py ports: found no {args.count} consecutive free ports", file=sys.stderr)
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--launchers", required=True)
    s.add_argument("--start", type=float, required=True)
    s.add_argument("--mode", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--every", type=float, default=10.0)
    s.add_argument("--stop")
    v = sub.add_parser("verdict")
    v.add_argument("--csv", required=True)
    v.add_argument("--events")
    v.add_argument("--warmup-min", type=float, default=5.0)
    v.add_argument("--plot")
    v.add_argument("--title")
    c = sub.add_parser("check")
    c.add_argument("--csv", required=True)
    c.add_argument("--events")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--crashes", type=int, default=0)
    c.add_argument("--rejoin-logs", help="folder of soak.sh's rejoin-*.log files")
    p = sub.add_parser("ports")
    p.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    return {"sample": sample, "verdict": verdict, "check": check,
            "ports": ports}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
