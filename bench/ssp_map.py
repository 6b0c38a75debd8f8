#!/usr/bin/python3
"""The SSP regime map of docs/ps-experiment.md (issue 29): per regime, node 0's median time to
target of BSP, the best SSP bound and async, as speed-ups over BSP, and which of them won.

Usage: bench/ssp_map.py --out docs/img/ssp-map.png [REGIME ...]
A REGIME is one of
  runs:LABEL=DIR:NODES     a bench/ps_experiment.sh --out folder (s-0, s-<N>, s-inf)
  compare:LABEL=DIR        a chorus compare --out folder (summary.csv; variants named ...:bsp,
                           ...:ssp:N, ...:async)
  row:LABEL=BSP,SSP,ASYNC,S  medians measured earlier (seconds; S the best bound), from the
                           tables of docs/ps-experiment.md
Prints the map as a Markdown table and draws it with gnuplot (clustered bars: speed-up over BSP
of the best SSP and of async; the line at 1.3 is the issue's bar).
"""
import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps_runs  # noqa: E402


def from_runs(folder, nodes):
    """(bsp, best ssp, async, s) medians of a ps_experiment.sh folder."""
    times = {}
    for d in glob.glob(os.path.join(folder, "s-*")):
        s = os.path.basename(d)[2:]
        times[s] = ps_runs.summarize_variant(d, nodes)["time_to_target"]
    return split(times)


def from_compare(folder):
    """The same from a compare folder's summary.csv: median over seeds, a miss slowest."""
    per = {}
    with open(os.path.join(folder, "summary.csv")) as f:
        for row in csv.DictReader(f):
            if row["status"] != "ok":
                continue
            name = row["variant"]
            if name.endswith(":bsp"):
                s = "0"
            elif name.endswith(":async"):
                s = "inf"
            elif ":ssp:" in name:
                s = name.rsplit(":", 1)[1]
            else:
                continue
            t = row["time_to_target_s"]
            per.setdefault(s, []).append(float(t) if t else None)
    return split({s: ps_runs.median_time(ts) for s, ts in per.items()})


def split(times):
    ssp = {s: t for s, t in times.items() if s not in ("0", "inf") and t is not None}
    best = min(ssp, key=ssp.get) if ssp else None
    return times.get("0"), ssp.get(best) if best else None, times.get("inf"), best


def winner(bsp, ssp, asy):
    present = [(t, n) for t, n in ((bsp, "BSP"), (ssp, "SSP"), (asy, "async")) if t is not None]
    if not present:
        return "none"
    present.sort()
    if len(present) > 1 and present[1][0] / present[0][0] < 1.05:
        return f"{present[0][1]} = {present[1][1]} (level)"
    return present[0][1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("regimes", nargs="+")
    args = ap.parse_args()
    rows = []
    for spec in args.regimes:
        kind, rest = spec.split(":", 1)
        label, what = rest.split("=", 1)
        if kind == "runs":
            folder, nodes = what.rsplit(":", 1)
            rows.append((label, *from_runs(folder, int(nodes))))
        elif kind == "compare":
            rows.append((label, *from_compare(what)))
        elif kind == "row":
            b, s, a, bound = what.split(",")
            num = lambda x: float(x) if x not in ("", "-") else None  # noqa: E731
            rows.append((label, num(b), num(s), num(a), bound))
        else:
            sys.exit(f"ssp_map.py: unknown regime kind '{kind}' in '{spec}'")
    fmt = lambda t: "not reached" if t is None else f"{t:.1f} s"  # noqa: E731
    print("| regime | BSP | best SSP | async | SSP over BSP | SSP over async | winner |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    data = os.path.splitext(args.out)[0] + ".dat"
    with open(data, "w") as f:
        for i, (label, b, s, a, bound) in enumerate(rows):
            over_b = b / s if b and s else None
            over_a = a / s if a and s else None
            print(f"| {label} | {fmt(b)} | {fmt(s)}{f' (s={bound})' if bound else ''} | {fmt(a)} | "
                  f"{'—' if over_b is None else f'{over_b:.2f}x'} | "
                  f"{'—' if over_a is None else f'{over_a:.2f}x'} | {winner(b, s, a)} |")
            sp = lambda t: (b / t) if (b and t) else 0  # noqa: E731
            f.write(f'{i} "{label}" {sp(s):.3f} {sp(a):.3f} "{winner(b, s, a)}"\n')
    script = f"""
set terminal pngcairo size 1100,560
set output '{args.out}'
set title "Where bounded staleness wins: speed-up over BSP in time to target (median of seeds), winner above"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel 'BSP time / variant time'
set yrange [0:*]
set grid ytics
set xtics rotate by -20 font ',9'
set arrow from graph 0, first 1.3 to graph 1, first 1.3 nohead dt 2 lc rgb 'red'
set label 'dashed: issue 29, 1.3x over BSP' at graph 0.01, graph 0.95 tc rgb 'red'
set arrow from graph 0, first 1 to graph 1, first 1 nohead lc rgb 'black'
set key top right
plot '{data}' using 3:xtic(2) title 'best SSP' lc rgb '#1f77b4', \\
     '' using 4 title 'async' lc rgb '#ff7f0e', \\
     '' using ($1):(($3 > $4 ? $3 : $4) + 0.12):5 with labels notitle noenhanced font ',9'
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
