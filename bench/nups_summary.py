#!/usr/bin/python3
"""Merges and summarizes the runs of bench/nups_experiment.sh (issue 25's experiment).

The script runs every variant and seed as its own `chorus compare` (a compare takes one sampling
scheme for all its PS variants) into OUT/runs/CELL/NAME/seed-S/ (one node alone:
OUT/runs/single-WORKLOAD/single/seed-S/). For each cell this script

- writes OUT/CELL/runs.jsonl, a compare manifest whose runs are those folders under the
  experiment's names (single, classic, lapse, nups, nups-local, auto), and runs
  `chorus report OUT/CELL`: its report.md, summary.csv and plots/quality-vs-time.png then put the
  variants side by side as one compare would;
- reads what the runs' metrics files say (nothing is re-timed here): node 0's training seconds
  per epoch and its evaluation after each epoch, the time to target (from the report's
  summary.csv: node 0's evaluations left out), final quality, local share, bytes sent per node,
  the sampled keys' local share and the replicas' staleness (mean and max over nodes);
- writes OUT/results.md: one table per cell (medians over seeds, [min, max] where there are
  several) and the issue's goals, each met or missed with the numbers.

Usage: bench/nups_summary.py --out DIR --chorus PATH --cell "NAME WORKLOAD NODES DELAYED SEEDS"
         [--cell ...] [--link-delay MS] [--require-all]
--require-all: exit 1 unless every variant of every cell has a finished run with every number
(the script's --short mode uses it as its check).
"""
import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys

NAMES = ["single", "classic", "lapse", "nups", "nups-local", "auto"]
NUPS_STYLE = ["nups", "nups-local", "auto"]
CONFORMING = ["classic", "lapse", "nups", "auto"]  # naive, preloc, pool: pi holds
# The name each variant has in the merged report: chorus report colors a name it does not know by
# a hash of it, and "nups-local" would be drawn in nups's brown; "nups local" gets olive.
REPORT_NAME = {"nups-local": "nups local"}
SCHEME = {
    "single": "the model's own i.i.d. draws",
    "classic": "naive",
    "lapse": "preloc",
    "nups": "pool, reuse 16",
    "nups-local": "onlylocal",
    "auto": "pool, reuse 16",
}


def read_jsonl(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                # A node that was stopped can leave its last line cut short.
                print(f"nups_summary: {path}:{number}: skipped, not JSON ({e})", file=sys.stderr)
    return out


def run_folders(out, cell, workload, name):
    """(seed, compare folder) of a variant's runs in a cell, by seed."""
    base = f"single-{workload}/single" if name == "single" else f"{cell}/{name}"
    found = []
    for folder in glob.glob(os.path.join(out, "runs", base, "seed-*")):
        if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, "runs.jsonl")):
            continue
        found.append((int(folder.rsplit("-", 1)[1]), folder))
    return sorted(found)


def merge_cell(out, cell, workload):
    """Writes OUT/CELL/runs.jsonl with every seed OUT holds; returns [(name, seed, run dir,
    error)]."""
    merged = os.path.join(out, cell)
    os.makedirs(merged, exist_ok=True)
    header, runs = None, []
    for name in NAMES:
        for seed, folder in run_folders(out, cell, workload, name):
            lines = read_jsonl(os.path.join(folder, "runs.jsonl"))
            for line in lines:
                if line.get("event") == "compare" and header is None:
                    header = line
                if line.get("event") != "run":
                    continue
                run_dir = os.path.join(folder, line["dir"])
                error = line.get("error", "") if line.get("status") != "ok" else ""
                runs.append((name, seed, run_dir, error))
    if header is None:
        return []
    names = [REPORT_NAME.get(n, n) for n in NAMES if any(r[0] == n for r in runs)]
    with open(os.path.join(merged, "runs.jsonl"), "w", encoding="utf-8") as f:
        top = {
            "event": "compare",
            "command": f"bench/nups_experiment.sh, cell {cell} (runs merged by bench/nups_summary.py)",
            "target_acc": 0,
        }
        if "target_metric" in header:
            top["target_metric"] = header["target_metric"]
            top["target"] = header["target"]
        top["variants"] = ",".join(names)
        f.write(json.dumps(top) + "\n")
        for name, seed, run_dir, error in runs:
            f.write(json.dumps({
                "event": "run", "variant": REPORT_NAME.get(name, name), "seed": seed,
                "dir": os.path.relpath(run_dir, merged),
                "status": "failed" if error else "ok", "error": error,
            }) + "\n")
    return runs


def node_files(run_dir):
    files = {}
    for path in glob.glob(os.path.join(run_dir, "node-*.jsonl")):
        files[int(os.path.basename(path)[5:-6])] = read_jsonl(path)
    return files


def first(events, kind):
    return next((e for e in events if e.get("event") == kind), None)


def run_metrics(run_dir, workload):
    """What one run's metrics files say."""
    nodes = node_files(run_dir)
    if 0 not in nodes:
        return None
    quality_key = "valid_mrr" if workload == "kge" else "test_rmse"
    events0 = nodes[0]
    summary0 = first(events0, "summary")
    if summary0 is None:
        return None
    m = {}
    epochs = summary0.get("epochs") or len([e for e in events0 if e.get("event") == "epoch"])
    m["epoch_s"] = summary0["train_seconds"] / epochs if epochs else None
    per_epoch = {}
    for e in events0:
        if e.get("event") == "epoch" and quality_key in e:
            per_epoch[e["epoch"]] = e[quality_key]
    if quality_key in summary0:
        per_epoch[summary0.get("evaluated_epoch", epochs)] = summary0[quality_key]
    m["per_epoch"] = per_epoch
    summaries = [first(ev, "summary") for ev in nodes.values()]
    summaries = [s for s in summaries if s]
    mean_stale = [s["replica_staleness_mean_s"] for s in summaries if "replica_staleness_mean_s" in s]
    max_stale = [s["replica_staleness_max_s"] for s in summaries if "replica_staleness_max_s" in s]
    if mean_stale:
        m["stale_mean_ms"] = 1000 * statistics.mean(mean_stale)
        m["stale_max_ms"] = 1000 * max(max_stale)
    sampled = [s["sampled_local_share"] for s in summaries if s.get("sampled_keys")]
    if sampled:
        m["sampled_local"] = statistics.mean(sampled)
    replica = [s["replica_keys"] / (s["keys_local"] + s["keys_remote"]) for s in summaries
               if "replica_keys" in s and s.get("keys_local", 0) + s.get("keys_remote", 0) > 0]
    if replica:
        m["replica_share"] = statistics.mean(replica)
    start0 = first(events0, "start") or {}
    if "replicated_keys" in start0:
        m["replicated_keys"] = start0["replicated_keys"]
    return m


def num(text):
    try:
        return float(text) if text not in ("", None) else None
    except ValueError:
        return None


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values, fmt):
    """median [min, max], or the one value."""
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def mb(v):
    return f"{v / 1e6:.1f} MB" if v < 1e9 else f"{v / 1e9:.2f} GB"


def summarize_cell(out, chorus, cell, workload, nodes, delayed):
    runs = merge_cell(out, cell, workload)
    if not runs:
        return None
    merged = os.path.join(out, cell)
    done = subprocess.run([chorus, "report", merged], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"nups_summary: chorus report {merged} failed: {done.stderr.strip()}", file=sys.stderr)
    rows = {}
    csv_path = os.path.join(merged, "summary.csv")
    if os.path.exists(csv_path):
        with open(csv_path, encoding="utf-8") as f:
            for row in csv.DictReader(f):
                rows[(row["variant"], int(row["seed"]))] = row
    header = read_jsonl(os.path.join(merged, "runs.jsonl"))[0]
    cell_info = {
        "cell": cell, "workload": workload, "nodes": nodes, "delayed": delayed,
        "metric": header.get("target_metric"), "target": header.get("target"), "variants": {},
    }
    for name in NAMES:
        mine = [r for r in runs if r[0] == name]
        if not mine:
            continue
        v = {"runs": len(mine), "ok": 0, "reached": 0, "seeds": [], "errors": []}
        cols = {k: [] for k in ("ttt", "epoch_s", "final", "local", "bytes", "sampled_local",
                                "stale_mean_ms", "stale_max_ms", "replica_share", "wait")}
        per_epoch = {}
        for _, seed, run_dir, error in mine:
            row = rows.get((REPORT_NAME.get(name, name), seed))
            if error or row is None or row.get("status") != "ok":
                v["errors"].append(f"seed {seed}: {error or (row or {}).get('error', 'no report row')}")
                continue
            m = run_metrics(run_dir, workload)
            if m is None:
                v["errors"].append(f"seed {seed}: node 0 has no summary line")
                continue
            v["ok"] += 1
            v["seeds"].append(seed)
            if row.get("reached_target") == "1":
                v["reached"] += 1
                cols["ttt"].append(num(row["time_to_target_s"]))
            cols["final"].append(num(row.get("final_quality")))
            cols["local"].append(num(row.get("local_share")))
            cols["bytes"].append(num(row.get("bytes_sent_per_node")))
            cols["wait"].append(num(row.get("wait_share")))
            for key in ("epoch_s", "sampled_local", "stale_mean_ms", "stale_max_ms", "replica_share"):
                cols[key].append(m.get(key))
            for epoch, q in m["per_epoch"].items():
                per_epoch.setdefault(epoch, []).append(q)
            v["replicated_keys"] = m.get("replicated_keys", v.get("replicated_keys"))
        v["cols"] = cols
        v["per_epoch"] = {e: med(qs) for e, qs in sorted(per_epoch.items())}
        cell_info["variants"][name] = v
    return cell_info


def cell_title(c, link_delay):
    work = "WN18RR ComplEx" if c["workload"] == "kge" else "Zipf MF"
    delay = f"--link-delay {link_delay} (ms per frame)" if c["delayed"] else "no link delay"
    return f"{work}, {c['nodes']} nodes, {delay}"


def cell_table(c):
    metric = "MRR" if c["workload"] == "kge" else "RMSE"
    target = c["target"]
    epoch_label = "valid MRR" if c["workload"] == "kge" else "test RMSE"
    lines = [
        f"| variant (negatives) | runs ok | reached {metric} {target} | time to target (s) | "
        f"training s per epoch (node 0) | {epoch_label} after epochs 1, 2, ... | final test {metric} | "
        "local accesses | sampled keys local | sent per node | replica staleness mean / max (ms) |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, v in c["variants"].items():
        cols = v["cols"]
        scheme = SCHEME[name] if c["workload"] == "kge" else "—"
        per_epoch = ", ".join(f"{q:.3f}" for q in v["per_epoch"].values()) or "—"
        ttt = spread(cols["ttt"], lambda x: f"{x:.2f}")
        if v["ok"] and not v["reached"]:
            ttt = "not reached"
        stale = "—"
        if any(x is not None for x in cols["stale_mean_ms"]):
            stale = f"{med(cols['stale_mean_ms']):.0f} / {med(cols['stale_max_ms']):.0f}"
        sampled = med(cols["sampled_local"])
        local = med(cols["local"])
        bytes_ = med(cols["bytes"])
        lines.append(
            f"| {name} ({scheme}) | {v['ok']}/{v['runs']} | {v['reached']}/{v['ok']} | {ttt} | "
            f"{spread(cols['epoch_s'], lambda x: f'{x:.2f}')} | {per_epoch} | "
            f"{spread(cols['final'], lambda x: f'{x:.3f}')} | "
            f"{'—' if local is None else f'{100 * local:.0f}%'} | "
            f"{'—' if sampled is None else f'{100 * sampled:.0f}%'} | "
            f"{'—' if bytes_ is None else mb(bytes_)} | {stale} |")
    return "\n".join(lines)


def ttt_of(c, name):
    v = c["variants"].get(name)
    if not v or not v["ok"]:
        return None
    return med(v["cols"]["ttt"]) if v["reached"] * 2 > v["ok"] else None


def goals(cells):
    """The issue's goals, met or missed, with the numbers."""
    out = ["## Goals", ""]
    # 1. Best NuPS-style variant >= 10x sooner than classic on one workload, >= 2x than lapse.
    out.append("**Best NuPS-style variant against classic and lapse** (median time to target; "
               "a variant that did not reach the target in most seeds counts as not reaching it):")
    out.append("")
    out.append("| cell | best NuPS-style | its time (s) | classic (s) | classic / best | lapse (s) | lapse / best |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    best_classic, best_lapse = {}, {}
    for c in cells:
        times = [(ttt_of(c, n), n) for n in NUPS_STYLE if ttt_of(c, n) is not None]
        classic, lapse = ttt_of(c, "classic"), ttt_of(c, "lapse")
        if not times:
            out.append(f"| {c['cell']} | none reached the target | — | "
                       f"{'—' if classic is None else f'{classic:.2f}'} | — | "
                       f"{'—' if lapse is None else f'{lapse:.2f}'} | — |")
            continue
        t, n = min(times)
        rc = classic / t if classic else None
        rl = lapse / t if lapse else None
        best_classic[c["cell"]] = rc
        best_lapse[c["cell"]] = rl
        out.append(f"| {c['cell']} | {n} | {t:.2f} | {'—' if classic is None else f'{classic:.2f}'} | "
                   f"{'—' if rc is None else f'{rc:.2f}x'} | {'—' if lapse is None else f'{lapse:.2f}'} | "
                   f"{'—' if rl is None else f'{rl:.2f}x'} |")
    met_10 = [k for k, r in best_classic.items() if r is not None and r >= 10]
    met_2 = [k for k, r in best_lapse.items() if r is not None and r >= 2]
    out.append("")
    out.append(f"- >= 10x sooner than classic on at least one workload: "
               f"{'met in ' + ', '.join(met_10) if met_10 else 'missed in every cell'}.")
    out.append(f"- >= 2x sooner than lapse: "
               f"{'met in ' + ', '.join(met_2) if met_2 else 'missed in every cell'}.")
    out.append("")
    # 2. Conforming schemes within MRR 0.01 of one node at equal epochs; what onlylocal costs.
    out.append("**Quality at equal epochs against one node** (node 0's evaluation after each epoch "
               "minus the single node's, medians over seeds; valid MRR or test RMSE; final: test "
               "quality after the last epoch):")
    out.append("")
    out.append("| cell | variant | gap to single after each epoch | largest | final test: variant - single | "
               "last epoch and final test within 0.01 |")
    out.append("| --- | --- | --- | ---: | ---: | --- |")
    for c in cells:
        single = c["variants"].get("single")
        if not single or not single["ok"]:
            continue
        for name in CONFORMING + ["nups-local"]:
            v = c["variants"].get(name)
            if not v or not v["ok"]:
                continue
            common = [e for e in v["per_epoch"] if e in single["per_epoch"]]
            gaps = [v["per_epoch"][e] - single["per_epoch"][e] for e in common]
            gap = max(gaps, key=abs) if gaps else None
            final = med(v["cols"]["final"]) - med(single["cols"]["final"])
            within = "yes" if gaps and abs(gaps[-1]) <= 0.01 and abs(final) <= 0.01 else "no"
            label = name + (" (not conforming)" if name == "nups-local" else "")
            each = ", ".join(f"{g:+.3f}" for g in gaps) or "—"
            out.append(f"| {c['cell']} | {label} | {each} | {'—' if gap is None else f'{gap:+.3f}'} | "
                       f"{final:+.3f} | {within} |")
    out.append("")
    # 3. Where classic is slower than one node.
    out.append("**Classic PS against one node** (time to target and training seconds per epoch, medians):")
    out.append("")
    out.append("| cell | single: to target (s) | classic: to target (s) | classic / single | "
               "s per epoch: single | classic | classic's local accesses |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in cells:
        s, k = c["variants"].get("single"), c["variants"].get("classic")
        if not s or not k or not s["ok"] or not k["ok"]:
            continue
        ts, tk = ttt_of(c, "single"), ttt_of(c, "classic")
        ratio = f"{tk / ts:.2f}x" if ts and tk else "—"
        out.append(f"| {c['cell']} | {'—' if ts is None else f'{ts:.2f}'} | "
                   f"{'—' if tk is None else f'{tk:.2f}'} | {ratio} | "
                   f"{med(s['cols']['epoch_s']):.2f} | {med(k['cols']['epoch_s']):.2f} | "
                   f"{100 * med(k['cols']['local']):.0f}% |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--chorus", required=True)
    parser.add_argument("--cell", action="append", default=[],
                        help="NAME WORKLOAD NODES DELAYED SEEDS, as the script's grid (every "
                             "seed found is summarized)")
    parser.add_argument("--link-delay", default="1")
    parser.add_argument("--require-all", action="store_true")
    args = parser.parse_args()
    cells = []
    for text in args.cell:
        parts = text.split()
        if len(parts) != 5 or parts[1] not in ("kge", "mf"):
            parser.error(f"--cell '{text}': want NAME kge|mf NODES DELAYED SEEDS")
        c = summarize_cell(args.out, args.chorus, parts[0], parts[1], int(parts[2]),
                           parts[3] == "1")
        if c is None:
            print(f"nups_summary: cell {parts[0]}: no runs in {args.out}/runs", file=sys.stderr)
            continue
        cells.append(c)
    text = ["# NuPS experiment: results", "",
            "Written by bench/nups_summary.py from the metrics files; docs/nups-experiment.md reads them.",
            ""]
    machine = os.path.join(args.out, "machine.txt")
    if os.path.exists(machine):
        with open(machine, encoding="utf-8") as f:
            text += ["```", f.read().rstrip(), "```", ""]
    failures = []
    for c in cells:
        text += [f"## {c['cell']}: {cell_title(c, args.link_delay)}", "", cell_table(c), ""]
        for name, v in c["variants"].items():
            for e in v["errors"]:
                text.append(f"- {name} failed: {e}")
                failures.append(f"{c['cell']} {name} {e}")
        text += [f"Plot: {c['cell']}/plots/quality-vs-time.png; table of `chorus report`: "
                 f"{c['cell']}/report.md", ""]
    text.append(goals(cells))
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    print(f"nups_summary: wrote {os.path.join(args.out, 'results.md')}")
    if args.require_all:
        problems = list(failures)
        for c in cells:
            for name in NAMES:
                if name == "nups-local" and c["workload"] == "mf":
                    continue
                v = c["variants"].get(name)
                if v is None:
                    continue  # left out by the script (a technique not built yet)
                if not v["ok"] or any(med(v["cols"][k]) is None for k in ("epoch_s", "final", "bytes")):
                    problems.append(f"{c['cell']} {name}: no finished run with every number")
                if name.startswith("nups") and med(v["cols"]["stale_mean_ms"]) is None:
                    problems.append(f"{c['cell']} {name}: no replica staleness in its metrics")
        if problems:
            for p in problems:
                print(f"nups_summary: error: {p}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
