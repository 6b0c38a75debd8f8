#!/usr/bin/env bash
# The PS-mode experiment of issues 5 and 29: N nodes (8 by default) train the MNIST mlp on iid
# shards under
# shifted-exponential stragglers plus one node 4x slower, once per consistency model and seed:
# BSP, SSP with s = 1 and 3, and fully asynchronous. Records node 0's time to the target test
# accuracy, the final accuracies, clocks per second, the share of time spent waiting and the
# training time (to the slowest worker's last clock); writes
# a Markdown table (medians over seeds) and a gnuplot plot of accuracy against wall time.
#
# Usage: bench/ps_experiment.sh [--seeds N] [--first-seed S] [--out DIR] [--rounds R]
#          [--variants "0 1 3 inf"] [--stragglers PROFILE] [--link-delay MS[,JITTER]]
#          [--shard iid|dirichlet:ALPHA] [--lr LR] [--momentum M] [--owner-momentum clock|push]
#          [--async-rounds cluster|worker] [--nodes N] [--link-loss P[,RTO_MS]]
#          [--target ACC] [--base-port PORT] [--chorus PATH] [--summarize-only]
# --first-seed S runs seeds S..N only (to add seeds to a DIR that holds the earlier ones).
# The metrics are read by bench/ps_runs.py (shared with bench/managed_comm.sh).
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
# --link-loss: the chance that a message meets a loss, and the retransmission time-out.
link_loss=none
nodes=8
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
    --link-loss) link_loss="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --lr) lr="$2"; shift 2 ;;
    --momentum) momentum="$2"; shift 2 ;;
    --owner-momentum) owner_momentum="$2"; shift 2 ;;
    --async-rounds) async_rounds="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
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
  topo="$out/complete$nodes.toml"
  "$chorus" topo gen complete --nodes "$nodes" --base-port "$base_port" -o "$topo" --force
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "nodes: $nodes; stragglers: $stragglers; link delay: $link_delay; link loss: $link_loss; shard: $shard; rounds: $rounds; seeds: $seeds; lr: $lr; momentum: $momentum ($owner_momentum); async rounds: $async_rounds"
  } >> "$out/machine.txt"
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
           --link-loss "$link_loss"
           --seed "$seed" --target-acc "$target"
           --eval-every 25 --out "$run")
      echo "$(date -u +%H:%M:%S) staleness $s seed $seed (load $(cut -d' ' -f1 /proc/loadavg))"
      printf '%q ' "${cmd[@]}" > "$run/command.txt"
      if ! "${cmd[@]}" > "$run/launch.log" 2>&1; then
        echo "  FAILED (see $run/launch.log)" >&2
        tail -3 "$run/launch.log" >&2
      fi
    done
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
fi

PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "$variants" "$target" "$nodes" <<'PY'
import os, sys
from ps_runs import summarize_variant, show, per_seed_times, write_curves  # bench/ps_runs.py
out, variants, target, nodes = sys.argv[1], sys.argv[2].split(), float(sys.argv[3]), int(sys.argv[4])
names = {"0": "BSP (s=0)", "inf": "async (s=inf)"}
def name(s):
    return names.get(s, "SSP s=" + s)
summaries = [(s, summarize_variant(os.path.join(out, f"s-{s}"), nodes)) for s in variants]
pct = f"{100 * target:g}%"
lines = [f"| staleness | reached {pct} | time to {pct} at node 0, per seed | median | updates to {pct} (all workers) | final accuracy node 0 | owners' model | clocks/s (node 0) | waiting share | training time | reads from cache (node 0) |",
         "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for s, v in summaries:
    lines.append(f"| {name(s)} | {v['reached']}/{v['runs']} | {per_seed_times(v)} s | "
                 f"{show(v['time_to_target'], '.1f')} s | {show(v['updates'], '.0f')} | "
                 f"{show(v['test_accuracy'], '.2f', 100)}% | {show(v['owner_accuracy'], '.2f', 100)}% | "
                 f"{show(v['clocks_per_s'], '.2f')} | {show(v['wait_share'], '.0f', 100)}% | "
                 f"{show(v['span'], '.1f')} s | {show(v['cache_hit_rate'], '.0f', 100)}% |")
table = "\n".join(lines)
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
print(table)
# Accuracy against wall time at node 0, seed 1 of each variant.
write_curves(os.path.join(out, "accuracy.dat"), summaries, name)
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
set title "PS mode, $nodes nodes, MNIST mlp, $shard shards, stragglers $stragglers (node 0, seed 1)"
set xlabel 'wall time (s)'
set ylabel 'test accuracy (%)'
set yrange [90:99]
set key bottom right
set grid
${plot%,}
GP
  echo "plot: $out/ps-accuracy.png"
fi
