#!/usr/bin/env bash
# Managed communication's experiment (issue 28, docs/managed-comm.md): N nodes train in PS mode
# over links with a delay, once per variant and seed: BSP, SSP with and without a bandwidth
# budget (managed communication: owners push their most-changed rows into the workers' caches),
# and fully asynchronous. Two workloads: the MNIST mlp (dense keys; target: node 0's test
# accuracy) and the Zipf MF (--workload mf: sparse rows at their homes; target: node 0's test
# RMSE of the owners' model, evaluated after every epoch). Records node 0's time to the target,
# the updates (clocks of all workers) and the bytes sent by all nodes until then, the share of
# node 0's reads served from its cache, clocks per second and the waiting share; writes a
# Markdown table (medians over seeds) and a gnuplot plot of the quality against time.
#
# Usage: bench/managed_comm.sh [--workload mnist|mf] [--nodes N] [--seeds N] [--first-seed S]
#          [--out DIR] [--rounds R] [--variants "0 1 1m 3 3m inf"] [--bandwidth MBPS]
#          [--link-delay MS[,JITTER]] [--stragglers PROFILE] [--lr LR] [--momentum M]
#          [--target ACC] [--epochs E] [--mf-cells C] [--batch B] [--target-rmse R]
#          [--chorus PATH] [--summarize-only]
# A variant is a staleness bound (0 = BSP, inf = async); a trailing "m" adds --bandwidth.
# mnist: --rounds, --stragglers, --lr, --momentum, --target; mf: --epochs, --mf-cells, --batch,
# --lr, --target-rmse (the generated 10,000 x 2,000 Zipf 1.1 ratings, rank 16, AdaGrad).
# The metrics are read by bench/ps_runs.py (shared with bench/ps_experiment.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nodes=4
seeds=3
first_seed=1
out="runs/managed-comm"
rounds=400
variants="0 1 1m 3 3m inf"
bandwidth=100
link_delay=10
stragglers="shifted-exp:20,40+transient:0.05,10,60"
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
base_port=27500
target=0.97
summarize_only=0
lr=0.05
momentum=0.9
workload=mnist
epochs=6
mf_cells=1000000
batch=1000
target_rmse=0.40
lr_given=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --first-seed) first_seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --bandwidth) bandwidth="$2"; shift 2 ;;
    --link-delay) link_delay="$2"; shift 2 ;;
    --stragglers) stragglers="$2"; shift 2 ;;
    --lr) lr="$2"; lr_given=1; shift 2 ;;
    --workload) workload="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --mf-cells) mf_cells="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --target-rmse) target_rmse="$2"; shift 2 ;;
    --momentum) momentum="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "managed_comm.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$workload" in
  mnist) ;;
  mf) [[ $lr_given -eq 1 ]] || lr=0.1 ;;
  *) echo "managed_comm.sh: --workload is mnist or mf, not '$workload'" >&2; exit 2 ;;
esac
if [[ ! -x "$chorus" ]]; then
  echo "managed_comm.sh: no chorus executable at $chorus; run 'make build' or pass --chorus" >&2
  exit 2
fi
for tool in python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "managed_comm.sh: $tool not found" >&2; exit 2; }
done

mkdir -p "$out"
if [[ $summarize_only -eq 0 ]]; then
  topo="$out/complete$nodes.toml"
  "$chorus" topo gen complete --nodes "$nodes" --base-port "$base_port" -o "$topo" --force
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    if [[ $workload == mf ]]; then
      echo "workload: mf, $mf_cells cells, $epochs epochs, batch $batch, lr $lr, target test RMSE $target_rmse; nodes: $nodes; link delay: $link_delay; bandwidth: $bandwidth Mbit/s; seeds: $first_seed-$seeds"
    else
      echo "nodes: $nodes; stragglers: $stragglers; link delay: $link_delay; bandwidth: $bandwidth Mbit/s; rounds: $rounds; seeds: $first_seed-$seeds; lr: $lr; momentum: $momentum"
    fi
  } >> "$out/machine.txt"
  # Seed-major order: load drift on a shared machine hits every variant alike.
  for seed in $(seq "$first_seed" "$seeds"); do
    for v in $variants; do
      s="${v%m}"
      extra=()
      [[ "$v" == *m ]] && extra=(--bandwidth "$bandwidth")
      run="$out/v-$v/seed-$seed"
      rm -rf "$run"
      mkdir -p "$run"
      if [[ $workload == mf ]]; then
        # Straggler injection is not wired into sparse PS runs: the link delay alone.
        cmd=("$chorus" launch "$topo" --mode ps --staleness "$s" "${extra[@]}" --timeout 1200
             --model mf --data zipf-mf --technique classic --mf-cells "$mf_cells" --epochs "$epochs"
             --batch "$batch" --lr "$lr" --link-delay "$link_delay"
             --seed "$seed" --out "$run")
      else
        cmd=("$chorus" launch "$topo" --mode ps --staleness "$s" "${extra[@]}" --timeout 1200
             --data mnist --data-dir "$data_dir" --model mlp --batch 64 --lr "$lr"
             --momentum "$momentum" --rounds "$rounds" --stragglers "$stragglers"
             --link-delay "$link_delay" --seed "$seed" --target-acc "$target"
             --eval-every 25 --out "$run")
      fi
      echo "$(date -u +%H:%M:%S) variant $v seed $seed (load $(cut -d' ' -f1 /proc/loadavg))"
      printf '%q ' "${cmd[@]}" > "$run/command.txt"
      if ! "${cmd[@]}" > "$run/launch.log" 2>&1; then
        echo "  FAILED (see $run/launch.log)" >&2
        tail -3 "$run/launch.log" >&2
      fi
    done
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
fi

if [[ $workload == mf ]]; then
PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "$variants" "$target_rmse" "$nodes" <<'PY'
import os, sys
from ps_runs import summarize_sparse_variant, show, per_seed_times  # bench/ps_runs.py
out, variants, target, nodes = sys.argv[1], sys.argv[2].split(), float(sys.argv[3]), int(sys.argv[4])
def name(v):
    managed = v.endswith("m")
    s = v.rstrip("m")
    base = {"0": "BSP", "inf": "async"}.get(s, f"SSP s={s}")
    return base + (" + managed" if managed else "")
summaries = [(v, summarize_sparse_variant(os.path.join(out, f"v-{v}"), nodes, "rmse", target))
             for v in variants]
lines = [f"| variant | reached RMSE {target:g} | time to target at node 0, per seed | median | updates to target | MB sent to target (all nodes) | final test RMSE | reads from the copy (node 0) | clocks/s (node 0) | waiting share | managed MB (all nodes, whole run) |",
         "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for v, r in summaries:
    lines.append(f"| {name(v)} | {r['reached']}/{r['runs']} | {per_seed_times(r)} s | "
                 f"{show(r['time_to_target'], '.1f')} s | {show(r['updates'], '.0f')} | "
                 f"{show(r['mbytes'], '.0f')} | {show(r['final'], '.4f')} | "
                 f"{show(r['cache_hit_rate'], '.0f', 100)}% | "
                 f"{show(r['clocks_per_s'], '.2f')} | {show(r['wait_share'], '.0f', 100)}% | "
                 f"{show(r['managed_mb'], '.0f')} |")
table = "\n".join(lines)
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
print(table)
with open(os.path.join(out, "accuracy.dat"), "w") as f:
    for v, r in summaries:
        for seed, s in r["seeds"]:
            if seed != "seed-1":
                continue
            f.write(f"# {name(v)}\n")
            for t, x in s["curve"]:
                f.write(f"{t:.3f} {x:.5f}\n")
            f.write("\n\n")
PY
else
PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "$variants" "$target" "$nodes" <<'PY'
import os, sys
from ps_runs import summarize_variant, show, per_seed_times, write_curves  # bench/ps_runs.py
out, variants, target, nodes = sys.argv[1], sys.argv[2].split(), float(sys.argv[3]), int(sys.argv[4])
def name(v):
    managed = v.endswith("m")
    s = v.rstrip("m")
    base = {"0": "BSP", "inf": "async"}.get(s, f"SSP s={s}")
    return base + (" + managed" if managed else "")
summaries = [(v, summarize_variant(os.path.join(out, f"v-{v}"), nodes)) for v in variants]
pct = f"{100 * target:g}%"
lines = [f"| variant | reached {pct} | time to {pct} at node 0, per seed | median | updates to {pct} | MB sent to {pct} (all nodes) | reads from cache (node 0) | clocks/s (node 0) | waiting share | managed MB (all nodes, whole run) |",
         "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for v, r in summaries:
    lines.append(f"| {name(v)} | {r['reached']}/{r['runs']} | {per_seed_times(r)} s | "
                 f"{show(r['time_to_target'], '.1f')} s | {show(r['updates'], '.0f')} | "
                 f"{show(r['mbytes'], '.0f')} | {show(r['cache_hit_rate'], '.0f', 100)}% | "
                 f"{show(r['clocks_per_s'], '.2f')} | {show(r['wait_share'], '.0f', 100)}% | "
                 f"{show(r['managed_mb'], '.0f')} |")
table = "\n".join(lines)
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
print(table)
write_curves(os.path.join(out, "accuracy.dat"), summaries, name)
PY

fi

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
set output '$out/managed-accuracy.png'
$(if [[ $workload == mf ]]; then
  echo "set title \"PS mode, $nodes nodes, Zipf MF, link delay $link_delay ms, budget $bandwidth Mbit/s (node 0, seed 1)\""
  echo "set xlabel 'training time (s)'"
  echo "set ylabel 'test RMSE'"
else
  echo "set title \"PS mode, $nodes nodes, MNIST mlp, link delay $link_delay ms, budget $bandwidth Mbit/s (node 0, seed 1)\""
  echo "set xlabel 'wall time (s)'"
  echo "set ylabel 'test accuracy (%)'"
  echo "set yrange [90:99]"
fi)
set key $([[ $workload == mf ]] && echo "top right" || echo "bottom right")
set grid
${plot%,}
GP
  echo "plot: $out/managed-accuracy.png"
fi
