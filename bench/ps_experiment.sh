#!/usr/bin/env bash
# The PS-mode experiment of issue 5: 8 nodes train the MNIST mlp on iid shards under
# shifted-exponential stragglers plus one node 4x slower, once per consistency model and seed:
# BSP, SSP with s = 1 and 3, and fully asynchronous. Records node 0's time to the target test
# accuracy, the final accuracies, clocks per second, the share of time spent waiting and the
# training time (to the slowest worker's last clock); writes
# a Markdown table (medians over seeds) and a gnuplot plot of accuracy against wall time.
#
# Usage: bench/ps_experiment.sh [--seeds N] [--first-seed S] [--out DIR] [--rounds R]
#          [--variants "0 1 3 inf"] [--stragglers PROFILE] [--link-delay MS[,JITTER]]
#          [--shard iid|dirichlet:ALPHA] [--lr LR] [--momentum M] [--owner-momentum clock|push]
#          [--async-rounds cluster|worker] [--chorus PATH] [--summarize-only]
# --first-seed S runs seeds S..N only (to add seeds to a DIR that holds the earlier ones).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seeds=3
first_seed=1
out="runs/ps-experiment"
rounds=400
variants="0 1 3 inf"
# The same profile as the consensus experiment (docs/consensus-experiment.md): every step
# sleeps 20 ms + Exp(mean 40 ms), and node 5 takes 4x as long for its whole step.
stragglers="shifted-exp:20,40+slow:5=4"
# --link-delay: every frame waits this long before it is sent (docs/stragglers.md); none by
# default, as on loopback.
link_delay=none
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
base_port=27300
target=0.97
summarize_only=0
lr=0.05
momentum=0.9
owner_momentum=clock
async_rounds=cluster
shard=iid

while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --first-seed) first_seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --stragglers) stragglers="$2"; shift 2 ;;
    --link-delay) link_delay="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --lr) lr="$2"; shift 2 ;;
    --momentum) momentum="$2"; shift 2 ;;
    --owner-momentum) owner_momentum="$2"; shift 2 ;;
    --async-rounds) async_rounds="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "ps_experiment.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! -x "$chorus" ]]; then
  echo "ps_experiment.sh: no chorus executable at $chorus; run 'make build' or pass --chorus" >&2
  exit 2
fi
for tool in python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "ps_experiment.sh: $tool not found" >&2; exit 2; }
done

mkdir -p "$out"
if [[ $summarize_only -eq 0 ]]; then
  topo="$out/complete8.toml"
  "$chorus" topo gen complete --nodes 8 --base-port "$base_port" -o "$topo" --force
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cores"
    echo "stragglers: $stragglers; link delay: $link_delay; shard: $shard; rounds: $rounds; seeds: $seeds; lr: $lr; momentum: $momentum ($owner_momentum); async rounds: $async_rounds"
  } > "$out/machine.txt"
  # Seed-major order: load drift on a shared machine hits every variant alike.
  for seed in $(seq "$first_seed" "$seeds"); do
    for s in $variants; do
      run="$out/s-$s/seed-$seed"
      rm -rf "$run"
      mkdir -p "$run"
      cmd=("$chorus" launch "$topo" --mode ps --staleness "$s" --timeout 1200 --data mnist
           --data-dir "$data_dir" --model mlp --shard "$shard" --batch 64 --lr "$lr" --momentum "$momentum"
           --owner-momentum "$owner_momentum" --async-rounds "$async_rounds"
           --rounds "$rounds" --stragglers "$stragglers" --link-delay "$link_delay"
           --seed "$seed" --target-acc "$target"
           --eval-every 25 --out "$run")
      echo "$(date -u +%H:%M:%S) staleness $s seed $seed"
      printf '%q ' "${cmd[@]}" > "$run/command.txt"
      if ! "${cmd[@]}" > "$run/launch.log" 2>&1; then
        echo "  FAILED (see $run/launch.log)" >&2
        tail -3 "$run/launch.log" >&2
      fi
    done
  done
fi

PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "$variants" "$target" <<'PY'
import glob, json, os, statistics, sys
from metrics_lines import load  # bench/metrics_lines.py
out, variants, target = sys.argv[1], sys.argv[2].split(), float(sys.argv[3])
names = {"0": "BSP (s=0)", "inf": "async (s=inf)"}
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
def med_time(xs):
    # A run that missed the target counts as slower than any that reached it.
    if not xs:
        return None
    m = statistics.median([float("inf") if x is None else x for x in xs])
    return None if m == float("inf") else m
def show(x, spec):
    return "n/a" if x is None else format(x, spec)
rows, curves = [], []
for s in variants:
    t0, acc0, owner, cps, wait, updates, span, reached, runs = [], [], [], [], [], [], [], 0, 0
    for run in sorted(glob.glob(os.path.join(out, f"s-{s}", "seed-*"))):
        files = sorted(glob.glob(os.path.join(run, "node-*.jsonl")))
        if len(files) != 8:
            continue
        node0 = load(os.path.join(run, "node-0.jsonl"))
        final = [e for e in node0 if e["event"] == "final"]
        if not final:
            continue
        runs += 1
        f = final[0]
        t = f["time_to_target"]
        if t >= 0:
            reached += 1
            # Statistical efficiency: how many updates (clocks of all workers, one push each)
            # were done by the time node 0 reached the target. Fewer means each update was worth
            # more; staleness shows up here, throughput in the time.
            updates.append(sum(1 for path in files for e in load(path)
                               if e["event"] == "clock" and e["time"] <= t))
        t0.append(t if t >= 0 else None)
        acc0.append(f["test_accuracy"])
        owner.append(f.get("owner_accuracy"))
        cps.append(f["clocks"] / f["seconds"])
        # The run lasts until its slowest worker's last clock.
        span.append(max(e["seconds"] for path in files for e in load(path) if e["event"] == "final"))
        wait.append(f["wait_s"] / f["seconds"])
        pts = [(e["time"], e["test_accuracy"]) for e in node0
               if e["event"] == "clock" and "test_accuracy" in e]
        curves.append((s, os.path.basename(run), pts))
    rows.append((s, runs, reached, med_time(t0), med(updates), med(acc0), med(owner), med(cps),
                 med(wait), med(span)))
pct = f"{100 * target:g}%"
lines = [f"| staleness | runs | reached {pct} | time to {pct} at node 0 (median) | updates to {pct} (all workers) | final accuracy node 0 | owners' model | clocks/s (node 0) | waiting share | training time |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for s, runs, reached, t, u, a, o, c, w, d in rows:
    lines.append(f"| {names.get(s, 'SSP s=' + s)} | {runs} | {reached}/{runs} | {show(t, '.1f')} s | "
                 f"{show(u, '.0f')} | {show(a and 100 * a, '.2f')}% | {show(o and 100 * o, '.2f')}% | "
                 f"{show(c, '.2f')} | {show(w and 100 * w, '.0f')}% | {show(d, '.1f')} s |")
table = "\n".join(lines)
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
print(table)
# Accuracy against wall time at node 0, seed 1 of each variant.
with open(os.path.join(out, "accuracy.dat"), "w") as f:
    for s, seed, pts in curves:
        if seed != "seed-1":
            continue
        f.write(f"# {names.get(s, 'SSP s=' + s)}\n")
        for t, a in pts:
            f.write(f"{t:.3f} {100 * a:.3f}\n")
        f.write("\n\n")
PY

blocks=$(grep -c '^#' "$out/accuracy.dat" || true)
if [[ "$blocks" -gt 0 ]]; then
  plot="plot"
  i=0
  while IFS= read -r title; do
    plot+=" '$out/accuracy.dat' index $i with linespoints title '${title#\# }',"
    i=$((i + 1))
  done < <(grep '^#' "$out/accuracy.dat")
  gnuplot <<GP
set terminal pngcairo size 900,560
set output '$out/ps-accuracy.png'
set title "PS mode, 8 nodes, MNIST mlp, $shard shards, stragglers $stragglers (node 0, seed 1)"
set xlabel 'wall time (s)'
set ylabel 'test accuracy (%)'
set yrange [90:99]
set key bottom right
set grid
${plot%,}
GP
  echo "plot: $out/ps-accuracy.png"
fi
