#!/usr/bin/env bash
# The consensus-mode experiment of issue 4: 8 nodes on a random 4-regular graph train the MNIST
# mlp on iid shards under shifted-exponential stragglers plus one node 4x slower, once per
# backup-worker rule and seed. Records the time to the target test accuracy, the final accuracy,
# the mean number of backup workers b_i and the share of time spent waiting; writes a Markdown
# table (medians over seeds) and gnuplot plots into the output directory.
#
# Usage: bench/consensus_experiment.sh [--seeds N] [--quick] [--out DIR] [--rounds R]
#          [--rules "wait-all static:1 ..."] [--stragglers PROFILE] [--link-delay MS[,JITTER]]
#          [--chorus PATH] [--eval-every N] [--base-port P] [--first-seed S] [--summarize-only]
# Defaults: 3 seeds (1..3), out runs/consensus-experiment, see below for the rest. --quick runs
# 1 seed. --first-seed S runs seeds S..N only (to add seeds to a DIR that already holds the
# earlier ones). --summarize-only rebuilds table and plots from the metrics already in DIR.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seeds=3
first_seed=1
out="runs/consensus-experiment"
rounds=400
eval_every=25
rules="wait-all static:1 static:2 deadline:0.75 dynamic"
# Every step sleeps 20 ms + Exp(mean 40 ms); node 5 (a neighbor of node 0) takes 4x as long
# for the whole step (compute and delays). The exponential tail is what backup workers can cut: on this 2-core machine an mlp
# step of 8 processes takes only a few ms of CPU, so the delays must dominate it, or the runs
# would measure CPU contention instead of stragglers (docs/consensus-experiment.md).
stragglers="shifted-exp:20,40+slow:5=4"
# --link-delay: every frame waits this long before it is sent (docs/stragglers.md); none by
# default, as on loopback.
link_delay=none
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
base_port=27100
target=0.97
summarize_only=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --quick) seeds=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --rules) rules="$2"; shift 2 ;;
    --stragglers) stragglers="$2"; shift 2 ;;
    --link-delay) link_delay="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --eval-every) eval_every="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --first-seed) first_seed="$2"; shift 2 ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "consensus_experiment.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$chorus" ]]; then
  echo "consensus_experiment.sh: no chorus executable at $chorus; build it with" >&2
  echo "  make build   (or: cmake -S $here -B $here/build && cmake --build $here/build -j2 --target chorus)" >&2
  echo "or pass --chorus PATH" >&2
  exit 2
fi
for tool in python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "consensus_experiment.sh: $tool not found" >&2; exit 2; }
done

mkdir -p "$out"
topo="$out/regular8.toml"
if [[ $summarize_only -eq 1 && -f "$out/machine.txt" ]]; then
  # Label the plots with the profile the runs in DIR used.
  stragglers="$(sed -n 's/^stragglers: \([^;]*\);.*/\1/p' "$out/machine.txt")"
fi
if [[ $summarize_only -eq 0 ]]; then
  "$chorus" topo gen regular --nodes 8 --degree 4 --seed 1 --base-port "$base_port" \
    -o "$topo" --force
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "stragglers: $stragglers; link delay: $link_delay; rounds: $rounds; eval-every: $eval_every; seeds: $seeds"
  } > "$out/machine.txt"
  for seed in $(seq "$first_seed" "$seeds"); do
    for rule in $rules; do
      run="$out/${rule//:/-}/seed-$seed"
      rm -rf "$run"
      mkdir -p "$run"
      cmd=("$chorus" launch "$topo" --timeout 1200 --data mnist --data-dir "$data_dir"
           --model mlp --shard iid --batch 64 --lr 0.05 --momentum 0.9 --rounds "$rounds"
           --backup "$rule" --stragglers "$stragglers" --link-delay "$link_delay"
           --seed "$seed" --target-acc "$target"
           --eval-every "$eval_every" --out "$run")
      echo "$(date -u +%H:%M:%S) rule $rule seed $seed: ${cmd[*]}"
      printf '%q ' "${cmd[@]}" > "$run/command.txt"
      if ! "${cmd[@]}" > "$run/launch.log" 2>&1; then
        echo "  FAILED (see $run/launch.log):" >&2
        tail -5 "$run/launch.log" >&2
      fi
      grep -E 'all .* finished|failed' "$run/launch.log" | tail -1 || true
    done
  done
fi

# Summary: one row per rule, medians over the seeds that ran.
PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "$rules" "$target" <<'PY'
import glob, json, os, statistics, sys
from metrics_lines import load  # bench/metrics_lines.py

out, rules, target = sys.argv[1], sys.argv[2].split(), float(sys.argv[3])

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)

rows, per_run = [], []
for rule in rules:
    runs = sorted(glob.glob(os.path.join(out, rule.replace(":", "-"), "seed-*")))
    node0_t, all_t, acc0, avg_acc, mean_b, wait_share, round_s, reached = [], [], [], [], [], [], [], 0
    used, target_round, skipped, stale = [], [], [], []
    for run in runs:
        files = sorted(glob.glob(os.path.join(run, "node-*.jsonl")))
        if len(files) != 8:
            continue
        nodes = {int(os.path.basename(f)[5:-6]): load(f) for f in files}
        finals = {i: [e for e in ev if e.get("event") == "final"] for i, ev in nodes.items()}
        if any(not f for f in finals.values()):
            continue
        # Time to target: seconds (since the node's metrics file opened, i.e. after the
        # cluster is connected) at which the node's test accuracy first was >= target.
        t = {i: finals[i][0]["time_to_target"] for i in nodes}
        t0 = t[0] if t[0] >= 0 else None
        tall = max(t.values()) if all(v >= 0 for v in t.values()) else None
        rounds_ev = [e for ev in nodes.values() for e in ev if e.get("event") == "round"]
        b = statistics.mean(e["backups"] for e in rounds_ev)
        # Neighbor models mixed per round (stale ones within tau included): for deadline:Q the
        # logged b_i is only the plan's floor (wait for >= 1), so this is what it really used.
        u = statistics.mean(e["used"] for e in rounds_ev)
        # Mean staleness (rounds) of the neighbor models mixed in, over all of them: what the
        # accuracy per round follows (docs/consensus-experiment.md).
        n_used = sum(e["used"] for e in rounds_ev)
        st = sum(e["staleness_mean"] * e["used"] for e in rounds_ev) / n_used if n_used else 0.0
        tr = [e["round"] for e in nodes[0] if e.get("event") == "target"]
        share = statistics.mean(finals[i][0]["wait_s"] / finals[i][0]["seconds"] for i in nodes)
        # Rounds jumped over by iteration skipping, summed over the nodes.
        sk = sum(finals[i][0].get("skipped_rounds", 0) for i in nodes)
        r0 = [e for e in nodes[0] if e.get("event") == "round"]
        rs = finals[0][0]["seconds"] / len(r0)
        seed = os.path.basename(run)
        per_run.append((rule, seed, t0, tall, finals[0][0]["test_accuracy"],
                        finals[0][0].get("average_accuracy"), b, u, share, rs,
                        tr[0] if tr else None, sk, st))
        stale.append(st)
        used.append(u); target_round.append(tr[0] if tr else None); skipped.append(sk)
        node0_t.append(t0); all_t.append(tall); acc0.append(finals[0][0]["test_accuracy"])
        avg_acc.append(finals[0][0].get("average_accuracy")); mean_b.append(b)
        wait_share.append(share); round_s.append(rs); reached += t0 is not None
    rows.append((rule, len(node0_t), reached, med(node0_t), med(all_t), med(acc0), med(avg_acc),
                 med(mean_b), med(used), med(wait_share), med(round_s), med(target_round),
                 med(skipped), med(stale)))

base = next((r[3] for r in rows if r[0] == "wait-all"), None)
with open(os.path.join(out, "results.md"), "w") as f:
    f.write(f"| rule | seeds | reached {target:.0%} (node 0) | time to {target:.0%}, node 0 (s) "
            f"| time to {target:.0%}, all nodes (s) | speed-up vs wait-all | final acc node 0 "
            f"| acc of average | mean b_i | models mixed / round | wait share | s / round "
            f"| round of {target:.0%} (node 0) | skipped rounds | staleness of mixed models |\n")
    f.write("|" + " --- |" * 15 + "\n")
    for (rule, n, reached, t0, tall, a0, aavg, b, u, share, rs, tr, sk, st) in rows:
        speed = base / t0 if base and t0 else None
        f.write(f"| {rule} | {n} | {reached}/{n} | {fmt(t0, '.1f')} | {fmt(tall, '.1f')} "
                f"| {fmt(speed, '.2f')}x | {fmt(a0 and a0 * 100, '.2f')}% "
                f"| {fmt(aavg and aavg * 100, '.2f')}% | {fmt(b, '.2f')} | {fmt(u, '.2f')} "
                f"| {fmt(share and share * 100, '.0f')}% | {fmt(rs, '.3f')} | {fmt(tr, '.0f')} "
                f"| {fmt(sk, '.0f')} | {fmt(st, '.2f')} |\n")
    f.write("\nPer run:\n\n| rule | seed | t97 node 0 (s) | t97 all (s) | final acc | avg acc "
            "| mean b_i | models mixed | wait share | s / round | round of target "
            "| skipped rounds | staleness |\n" + "|" + " --- |" * 13 + "\n")
    for (rule, seed, t0, tall, a0, aavg, b, u, share, rs, tr, sk, st) in per_run:
        f.write(f"| {rule} | {seed} | {fmt(t0, '.1f')} | {fmt(tall, '.1f')} | {a0 * 100:.2f}% "
                f"| {fmt(aavg and aavg * 100, '.2f')}% | {b:.2f} | {u:.2f} | {share * 100:.0f}% "
                f"| {rs:.3f} | {fmt(tr, '.0f')} | {sk} | {st:.2f} |\n")

# Plot data (seed 1 of each rule): node 0's test accuracy against its wall time, and the
# backups b_i of every node against the round for the dynamic rule.
plot_dir = os.path.join(out, "plot-data")
os.makedirs(plot_dir, exist_ok=True)
for rule in rules:
    run = os.path.join(out, rule.replace(":", "-"), "seed-1")
    path = os.path.join(run, "node-0.jsonl")
    if not os.path.exists(path):
        continue
    with open(os.path.join(plot_dir, "acc-" + rule.replace(":", "-") + ".dat"), "w") as f:
        for e in load(path):
            if e.get("event") == "round" and "test_accuracy" in e:
                f.write(f"{e['time']:.3f} {e['test_accuracy']:.4f}\n")
for rule in rules:
    if not rule.startswith("dynamic"):
        continue
    run = os.path.join(out, rule.replace(":", "-"), "seed-1")
    per_round = {}
    for path in sorted(glob.glob(os.path.join(run, "node-*.jsonl"))):
        for e in load(path):
            if e.get("event") == "round":
                per_round.setdefault(e["round"], []).append(e["backups"])
    # Mean over the nodes, smoothed over the last 10 rounds.
    means = [statistics.mean(per_round[r]) for r in sorted(per_round)]
    with open(os.path.join(plot_dir, "backups-mean.dat"), "w") as f:
        for r, _ in enumerate(means):
            window = means[max(0, r - 9):r + 1]
            f.write(f"{r} {statistics.mean(window):.3f}\n")
    for path in sorted(glob.glob(os.path.join(run, "node-*.jsonl"))):
        node = os.path.basename(path)[5:-6]
        with open(os.path.join(plot_dir, f"backups-node-{node}.dat"), "w") as f:
            for e in load(path):
                if e.get("event") == "round":
                    f.write(f"{e['round']} {e['backups']}\n")
print(open(os.path.join(out, "results.md")).read())
PY

# Plots.
pd="$out/plot-data"
acc_plots=()
for rule in $rules; do
  d="$pd/acc-${rule//:/-}.dat"
  [[ -f "$d" ]] && acc_plots+=("'$d' using 1:2 with linespoints title '$rule'")
done
if [[ ${#acc_plots[@]} -gt 0 ]]; then
  gnuplot <<EOF
set terminal pngcairo size 720,440 font ',10'
set output '$out/accuracy-vs-time.png'
set title 'MNIST mlp, 8 nodes, 4-regular, $stragglers: node 0 test accuracy (seed 1)'
set xlabel 'wall time at node 0 (s)'
set ylabel 'test accuracy'
set yrange [0.9:0.985]
set grid
set key bottom right
set arrow from graph 0, first $target to graph 1, first $target nohead dashtype 2
plot $(IFS=,; echo "${acc_plots[*]}")
EOF
fi
if ls "$pd"/backups-node-*.dat >/dev/null 2>&1; then
  b_plots=()
  for d in "$pd"/backups-node-*.dat; do
    n="${d##*backups-node-}"; n="${n%.dat}"
    b_plots+=("'$d' using 1:(\$2 + 0.06 * ($n - 3.5)) with steps lw 0.6 title 'node $n'")
  done
  b_plots+=("'$pd/backups-mean.dat' using 1:2 with lines lw 3 lc rgb 'black' title 'mean, 10-round avg'")
  gnuplot <<EOF
set terminal pngcairo size 720,440 font ',10'
set output '$out/backups-vs-round.png'
set title 'dynamic rule: backup workers b_i per round (seed 1; lines offset slightly per node)'
set xlabel 'round'
set ylabel 'b_i'
set yrange [-0.5:3.5]
set grid
set key outside right
plot $(IFS=,; echo "${b_plots[*]}")
EOF
fi
echo "results: $out/results.md; plots: $out/accuracy-vs-time.png $out/backups-vs-round.png"
