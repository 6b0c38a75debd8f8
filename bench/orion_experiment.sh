#!/usr/bin/env bash
# Issue 28 part 2's measurements (docs/orion.md): Orion's rotation schedule for MF against the
# data-parallel techniques on Zipf MF, and rotation's neighbour hand-off against its all-worker
# barrier, on 4 and 8 nodes of this machine.
#
# Variants (each a `chorus launch` of the same Zipf MF job, --seed S):
#   rotation          --mf-schedule rotation (hand-offs between neighbours)
#   rotation-barrier  --mf-schedule rotation-barrier (every worker waits for all at each
#                     sub-epoch: the schedule before the hand-off, kept to measure against)
#   classic           --technique classic (data-parallel SSP, PS mode's default bound 2)
#   lapse             --technique lapse (rows relocated to where they are used)
#   nups              --technique nups (hot rows replicated, the others relocated)
# The runs are interleaved, seed-major, then nodes, then variant, so that the load drift of the
# shared machine hits every variant alike. bench/orion_summary.py then reads the runs' metrics
# files (nothing is re-timed) and writes OUT/results.md.
#
# Usage: bench/orion_experiment.sh [--out DIR] [--seeds N] [--nodes "4 8"] [--epochs E]
#          [--variants "rotation classic ..."] [--target RMSE] [--base-port P] [--short]
#          [--summarize-only]
#   --short  two small runs per variant on 2 nodes, one seed (a check that everything runs and
#            the summary is whole; about a minute)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chorus="${CHORUS:-$here/build/cli/chorus}"
out="runs/orion-experiment"
seeds=3
nodes_list="4 8"
epochs=6
variants="rotation rotation-barrier classic lapse nups"
target=0.45
base_port=29300
short=0
summarize_only=0
mf_flags=(--model mf --mf-rows 10000 --mf-cols 2000 --mf-cells 1000000)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --nodes) nodes_list="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --short) short=1; shift ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "orion_experiment.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $short -eq 1 ]]; then
  seeds=1
  nodes_list="2"
  epochs=2
  mf_flags=(--model mf --mf-rows 2000 --mf-cols 400 --mf-cells 60000)
  target=5
fi
[[ -x $chorus ]] || { echo "orion_experiment.sh: no chorus at $chorus (build first)" >&2; exit 1; }

flags_of() {
  case "$1" in
    rotation) echo "--mf-schedule rotation" ;;
    rotation-barrier) echo "--mf-schedule rotation-barrier" ;;
    classic|lapse|nups) echo "--technique $1" ;;
    *) echo "orion_experiment.sh: unknown variant '$1'" >&2; exit 2 ;;
  esac
}

mkdir -p "$out/topologies"
log="$out/log.txt"
if [[ $summarize_only -eq 0 ]]; then
  for n in $nodes_list; do
    "$chorus" topo gen complete --nodes "$n" --mode ps --base-port $((base_port + 20 * n)) \
      --name "orion-n$n" -o "$out/topologies/n$n.toml" --force > /dev/null
  done
  {
    echo "start: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "host: $(uname -srm), $(nproc) cores; chorus $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "mf: ${mf_flags[*]} --epochs $epochs, target RMSE $target; variants: $variants; nodes: $nodes_list"
  } >> "$out/machine.txt"
  for seed in $(seq 1 "$seeds"); do
    for n in $nodes_list; do
      for v in $variants; do
        dir="$out/runs/n$n/$v/seed-$seed"
        if [[ -s $dir/node-0.jsonl ]] && grep -qs '"event":"summary"' "$dir/node-0.jsonl"; then
          continue  # finished before: an interrupted grid goes on where it stopped
        fi
        rm -rf "$dir"
        mkdir -p "$(dirname "$dir")"
        # shellcheck disable=SC2046
        cmd=("$chorus" launch "$out/topologies/n$n.toml" "${mf_flags[@]}" --epochs "$epochs"
             --seed "$seed" $(flags_of "$v") --out "$dir")
        echo "[$(date -u +%H:%M:%S)] n$n $v seed $seed; load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
        echo "  ${cmd[*]}" >> "$log"
        if ! "${cmd[@]}" > "$dir.out" 2>&1; then
          echo "  failed: $(grep -m1 -iE 'error|failed' "$dir.out" || tail -1 "$dir.out")" | tee -a "$log"
        fi
      done
    done
  done
  echo "end: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
fi
/usr/bin/python3 "$here/bench/orion_summary.py" --out "$out" --target "$target" \
  --nodes "$nodes_list" --variants "$variants"
