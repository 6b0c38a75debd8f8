"""What bench/ps_experiment.sh and bench/managed_comm.sh read from a PS run's metrics files.

One run is a folder with node-<id>.jsonl per node (the --out of `chorus launch`). The events are
the ones every mode writes (run/training_loop.cc): a `step` line per training step (files
written before the modes shared the name say `clock`; both are read), a `target` line when
node 0's test accuracy first reaches --target-acc, and a `final` line with `steps`, `seconds`,
`wait_s` and `time_to_target` (-1 when the target was missed). Older `final` lines said
`clocks` for `steps`; both are read.

`summarize_run` turns one run into a dict of numbers; `summarize_variant` takes the medians over
the seeds of a variant. The scripts only format tables and plots from those. Nothing here
decides a winner: the experiment's pages do, and `chorus compare` for the user's own runs
(report/conclusion.h).
"""
import glob
import os
import statistics

from metrics_lines import load  # bench/metrics_lines.py

# The names of a training step's event, newest first (run::kStepName is "step").
STEP_EVENTS = ("step", "clock", "round")


def steps(events):
    """The training-step events of one file, in order."""
    return [e for e in events if e["event"] in STEP_EVENTS]


def final_event(events):
    """The last `final` event (a resumed node writes one per life), or None."""
    finals = [e for e in events if e["event"] == "final"]
    return finals[-1] if finals else None


def steps_done(final):
    """The steps a node ran, from its final event (`steps`, or `clocks` in older files)."""
    return final.get("steps", final.get("clocks", 0))


def target_time(events, final):
    """When node 0 reached the target, in its metrics file's own time (the `time` field), or None.

    The `target` event's `time` is on the same clock as every step line, so the updates counted
    up to it are the ones done when the target was reached. `final.time_to_target` starts at the
    first step instead (a few seconds of connecting and loading later); it is the fallback for
    files without a `target` line.
    """
    for e in events:
        if e["event"] == "target":
            return e["time"]
    t = final.get("time_to_target", -1)
    return t if t >= 0 else None


def summarize_run(run, nodes):
    """The numbers of one run folder, or None when it is incomplete (not `nodes` metrics files,
    or node 0 has no final line: the run failed or was killed).

    Keys: reached (bool), time_to_target (s, node 0's `time_to_target`, or None), updates (step
    lines of all nodes up to node 0's target), mbytes (bytes_sent of all nodes up to then, MB),
    test_accuracy and owner_accuracy (node 0's final), clocks_per_s and wait_share (node 0),
    span (the slowest node's training seconds), cache_hit_rate (node 0's final), managed_mb (all
    nodes' managed_bytes, MB), curve ([(time, test accuracy)] of node 0).
    """
    files = sorted(glob.glob(os.path.join(run, "node-*.jsonl")))
    if len(files) != nodes:
        return None
    node0 = load(os.path.join(run, "node-0.jsonl"))
    f = final_event(node0)
    if f is None:
        return None
    every = [load(p) for p in files]
    t = f.get("time_to_target", -1)
    reached = t >= 0
    updates = mbytes = None
    if reached:
        at = target_time(node0, f)
        # Statistical efficiency: the updates (one push per step of each worker) and bytes spent
        # by the time node 0 reached the target. Fewer updates means each was worth more.
        updates = sum(1 for events in every for e in steps(events) if e["time"] <= at)
        mbytes = sum(e.get("bytes_sent", 0) for events in every for e in steps(events)
                     if e["time"] <= at) / 1e6
    finals = [final_event(events) for events in every]
    seconds = f.get("seconds", 0)
    return {
        "reached": reached,
        "time_to_target": t if reached else None,
        "updates": updates,
        "mbytes": mbytes,
        "test_accuracy": f.get("test_accuracy"),
        "owner_accuracy": f.get("owner_accuracy"),
        "clocks_per_s": steps_done(f) / seconds if seconds > 0 else None,
        "wait_share": f.get("wait_s", 0) / seconds if seconds > 0 else None,
        "span": max((x.get("seconds", 0) for x in finals if x), default=None),
        "cache_hit_rate": f.get("cache_hit_rate"),
        "managed_mb": sum(x.get("managed_bytes", 0) for x in finals if x) / 1e6,
        "curve": [(e["time"], e["test_accuracy"]) for e in steps(node0) if "test_accuracy" in e],
    }


def median(xs):
    """The median of the values that are not None, or None."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def median_time(xs):
    """The median time to target; a run that missed it counts as slower than any that reached
    it, so the median is None when half the runs or more missed."""
    if not xs:
        return None
    m = statistics.median([float("inf") if x is None else x for x in xs])
    return None if m == float("inf") else m


def summarize_variant(folder, nodes):
    """The runs under folder/seed-*, summarized, and their medians.

    Returns a dict: runs (count), reached (count), seeds ([(seed folder name, run summary)]),
    and the median of every number of summarize_run (time_to_target by median_time).
    """
    seeds = []
    for run in sorted(glob.glob(os.path.join(folder, "seed-*")),
                      key=lambda p: int(p.rsplit("-", 1)[1]) if p.rsplit("-", 1)[1].isdigit() else 0):
        summary = summarize_run(run, nodes)
        if summary is not None:
            seeds.append((os.path.basename(run), summary))
    runs = [s for _, s in seeds]
    out = {"runs": len(runs), "reached": sum(1 for s in runs if s["reached"]), "seeds": seeds,
           "time_to_target": median_time([s["time_to_target"] for s in runs])}
    for key in ("updates", "mbytes", "test_accuracy", "owner_accuracy", "clocks_per_s",
                "wait_share", "span", "cache_hit_rate", "managed_mb"):
        out[key] = median([s[key] for s in runs])
    return out


def show(x, spec, scale=1):
    """x formatted, "n/a" when None."""
    return "n/a" if x is None else format(scale * x, spec)


def per_seed_times(variant):
    """'33.5 / — / 41.0': node 0's time to target per seed ('—' where it was missed)."""
    return " / ".join("—" if s["time_to_target"] is None else f"{s['time_to_target']:.1f}"
                      for _, s in variant["seeds"])


def write_curves(path, variants, label):
    """Node 0's accuracy against time, seed 1 of each variant, as gnuplot data blocks titled
    '# <label(variant)>'. variants: [(variant name, summarize_variant result)]."""
    with open(path, "w") as f:
        for v, summary in variants:
            for seed, s in summary["seeds"]:
                if seed != "seed-1":
                    continue
                f.write(f"# {label(v)}\n")
                for t, a in s["curve"]:
                    f.write(f"{t:.3f} {100 * a:.3f}\n")
                f.write("\n\n")


# ---- Sparse PS runs (bench/managed_comm.sh --workload mf) ----
# A sparse run's node files (ps/sparse_ps_peer.cc) have an `epoch` line per epoch with
# train_seconds (the clocks only, evaluations left out), step (the clocks so far) and bytes_out;
# node 0's also carry the test metrics of the owners' model after every epoch but the last,
# whose metrics are in the `summary` line (with train_seconds, wait_seconds, steps and the
# managed-communication counters).


def sparse_epochs(events):
    return [e for e in events if e["event"] == "epoch"]


def summary_event(events):
    s = [e for e in events if e["event"] == "summary"]
    return s[-1] if s else None


def summarize_sparse_run(run, nodes, metric, target):
    """The numbers of one sparse run folder, or None when it is incomplete.

    Node 0's time to target: its train_seconds at the first epoch whose `test_<metric>` is at
    or below `target` (the last epoch's from the summary line). updates: the clocks of all
    workers by then (every worker runs the same clocks per epoch); mbytes: the bytes all nodes
    sent by the end of that epoch. Keys as summarize_run's, plus final (node 0's last test
    metric) and curve ([(train seconds, metric)] of node 0).
    """
    files = sorted(glob.glob(os.path.join(run, "node-*.jsonl")))
    if len(files) != nodes:
        return None
    every = [load(p) for p in files]
    node0 = load(os.path.join(run, "node-0.jsonl"))
    s = summary_event(node0)
    if s is None:
        return None
    key = "test_" + metric
    points = [(e["epoch"], e["train_seconds"], e[key]) for e in sparse_epochs(node0) if key in e]
    epochs = sparse_epochs(node0)
    if key in s and epochs:
        points.append((epochs[-1]["epoch"], s.get("train_seconds", epochs[-1]["train_seconds"]),
                       s[key]))
    reached_epoch = next(((ep, t) for ep, t, v in points if v <= target), None)
    seconds = s.get("train_seconds", 0)
    out = {
        "reached": reached_epoch is not None,
        "time_to_target": reached_epoch[1] if reached_epoch else None,
        "updates": None,
        "mbytes": None,
        "final": s.get(key),
        "clocks_per_s": s.get("steps", 0) / seconds if seconds > 0 else None,
        "wait_share": s.get("wait_seconds", 0) / seconds if seconds > 0 else None,
        "cache_hit_rate": s.get("cache_hit_rate"),
        "managed_mb": sum((summary_event(ev) or {}).get("managed_bytes", 0) for ev in every) / 1e6,
        "curve": [(t, v) for _, t, v in points],
    }
    if reached_epoch:
        ep = reached_epoch[0]
        at = [next((e for e in sparse_epochs(ev) if e["epoch"] == ep), None) for ev in every]
        if all(a is not None for a in at):
            out["updates"] = sum(a["step"] for a in at)
            out["mbytes"] = sum(a.get("bytes_out", 0) for a in at) / 1e6
    return out


def summarize_sparse_variant(folder, nodes, metric, target):
    """summarize_variant for sparse runs (summarize_sparse_run per seed folder)."""
    seeds = []
    for run in sorted(glob.glob(os.path.join(folder, "seed-*")),
                      key=lambda p: int(p.rsplit("-", 1)[1]) if p.rsplit("-", 1)[1].isdigit() else 0):
        summary = summarize_sparse_run(run, nodes, metric, target)
        if summary is not None:
            seeds.append((os.path.basename(run), summary))
    runs = [s for _, s in seeds]
    out = {"runs": len(runs), "reached": sum(1 for s in runs if s["reached"]), "seeds": seeds,
           "time_to_target": median_time([s["time_to_target"] for s in runs])}
    for key in ("updates", "mbytes", "final", "clocks_per_s", "wait_share", "cache_hit_rate",
                "managed_mb"):
        out[key] = median([s[key] for s in runs])
    return out
