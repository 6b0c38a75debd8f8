#!/usr/bin/python3
"""Summarizes the runs of bench/orion_experiment.sh (issue 28 part 2, docs/orion.md).

Reads what each run's metrics files say (OUT/runs/nN/VARIANT/seed-S/node-*.jsonl; nothing is
re-timed here) and writes OUT/results.md, one table per node count, medians over seeds with
[min, max] where there are several:

- test RMSE of node 0's model after each epoch (its evaluation at the epoch's end);
- time to the target RMSE: node 0's training seconds up to the end of the first epoch whose
  evaluation is at or below the target (evaluations not counted);
- seconds per epoch (node 0's training seconds / epochs);
- MB each node sent per epoch during its clocks (summary clock_bytes_out / epochs, mean over
  nodes);
- the share of the training time spent waiting (reads and, for rotation, the sub-epoch
  synchronization), and of it the synchronization, mean over nodes;
- the share of row reads and writes served locally, mean over nodes;
- for rotation, the plan's predicted load balance (the start event).

Usage: bench/orion_summary.py --out DIR [--target RMSE] [--nodes "4 8"] [--variants "..."]
"""
import argparse
import glob
import json
import os
import statistics


def read_jsonl(path):
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return events


def first(events, kind):
    return next((e for e in events if e.get("event") == kind), None)


def run_metrics(run_dir, target):
    nodes = {}
    for path in glob.glob(os.path.join(run_dir, "node-*.jsonl")):
        name = os.path.basename(path)[5:-6]
        if name.isdigit():
            nodes[int(name)] = read_jsonl(path)
    if 0 not in nodes:
        return None
    summary0 = first(nodes[0], "summary")
    if summary0 is None or summary0.get("stopped"):
        return None
    m = {"rmse": {}, "ttt": None}
    train = 0.0
    for e in nodes[0]:
        if e.get("event") != "epoch":
            continue
        train += e.get("epoch_seconds", 0.0)
        if "test_rmse" in e:
            m["rmse"][e["epoch"]] = e["test_rmse"]
            if m["ttt"] is None and e["test_rmse"] <= target:
                m["ttt"] = (train, e["epoch"])
    epochs = summary0.get("epochs") or 1
    if "test_rmse" in summary0:
        m["rmse"][epochs] = summary0["test_rmse"]
        if m["ttt"] is None and summary0["test_rmse"] <= target:
            m["ttt"] = (summary0["train_seconds"], epochs)
    m["epoch_s"] = summary0["train_seconds"] / epochs
    summaries = [first(ev, "summary") for ev in nodes.values()]
    summaries = [s for s in summaries if s]
    m["mb_epoch"] = statistics.mean(s["clock_bytes_out"] / epochs / 1e6 for s in summaries)
    m["wait"] = statistics.mean(s["wait_seconds"] / s["train_seconds"] for s in summaries
                                if s.get("train_seconds"))
    barrier = [s["barrier_seconds"] / s["train_seconds"] for s in summaries
               if "barrier_seconds" in s and s.get("train_seconds")]
    m["barrier"] = statistics.mean(barrier) if barrier else None
    m["local"] = statistics.mean(s["local_share"] for s in summaries if "local_share" in s)
    start0 = first(nodes[0], "start") or {}
    if "rotation_idle_share" in start0:
        m["plan"] = (start0.get("rotation_max_over_mean"), start0["rotation_idle_share"],
                     start0.get("rotation_handoff_idle_share"),
                     start0.get("rotation_floor_idle_share"))
    return m


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", type=float, default=0.45)
    parser.add_argument("--nodes", default="4 8")
    parser.add_argument("--variants", default="rotation rotation-barrier classic lapse nups")
    args = parser.parse_args()
    lines = ["# bench/orion_experiment.sh results", ""]
    machine = os.path.join(args.out, "machine.txt")
    if os.path.exists(machine):
        with open(machine, encoding="utf-8") as f:
            lines += ["```", f.read().strip(), "```", ""]
    for n in args.nodes.split():
        lines += [f"## {n} nodes", "",
                  f"| variant | runs | test RMSE after each epoch (median) | time to RMSE "
                  f"{args.target} (s) | s per epoch | MB sent per node and epoch | waiting | "
                  f"of which sub-epoch sync | local share |",
                  "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        plans = []
        for v in args.variants.split():
            runs = []
            for d in sorted(glob.glob(os.path.join(args.out, "runs", f"n{n}", v, "seed-*"))):
                m = run_metrics(d, args.target)
                if m:
                    runs.append(m)
            if not runs:
                lines.append(f"| {v} | 0 | - | - | - | - | - | - | - |")
                continue
            epochs = sorted({e for m in runs for e in m["rmse"]})
            rmse = " ".join(
                f"{statistics.median([m['rmse'][e] for m in runs if e in m['rmse']]):.3f}"
                for e in epochs)
            reached = [m["ttt"][0] for m in runs if m["ttt"]]
            ttt = spread(reached, lambda x: f"{x:.1f}")
            if len(reached) < len(runs):
                ttt += f" ({len(reached)}/{len(runs)} reached)"
            lines.append(
                f"| {v} | {len(runs)} | {rmse} | {ttt} | "
                f"{spread([m['epoch_s'] for m in runs], lambda x: f'{x:.2f}')} | "
                f"{spread([m['mb_epoch'] for m in runs], lambda x: f'{x:.1f}')} | "
                f"{spread([m['wait'] for m in runs], lambda x: f'{100 * x:.0f}%')} | "
                f"{spread([m['barrier'] for m in runs], lambda x: f'{100 * x:.0f}%')} | "
                f"{spread([m['local'] for m in runs], lambda x: f'{100 * x:.0f}%')} |")
            if "plan" in runs[0]:
                p = runs[0]["plan"]
                plans.append(f"- {v}: busiest worker {p[0]:.2f}x the mean per sub-epoch, "
                             f"predicted idle {100 * p[1]:.1f}% with barriers, "
                             f"{100 * p[2]:.1f}% with hand-offs, floor {100 * p[3]:.1f}%")
        lines += [""] + plans + [""]
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
