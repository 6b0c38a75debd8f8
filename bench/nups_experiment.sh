#!/usr/bin/env bash
# Issue 25's experiment: NuPS-style per-key management against classic and Lapse-style sparse
# PS, and against one node alone, on WN18RR ComplEx and Zipf MF, on 4 and 8 nodes of this
# machine, without and with a link delay (docs/nups-experiment.md has the results and reads them).
#
# Variants (each with its sampling scheme for KGE's negatives; MF samples no rows):
#   single      one node alone on the whole training set (chorus compare's `single`)
#   classic     ps:classic, --sample-scheme naive
#   lapse       ps:lapse,   --sample-scheme preloc
#   nups        ps:nups,    --sample-scheme pool --sample-reuse 16 (NuPS untuned)
#   nups-local  ps:nups,    --sample-scheme onlylocal (NuPS tuned; KGE only)
#   auto        ps:auto,    --sample-scheme pool --sample-reuse 16 (left out, with a message,
#               while this build's --technique does not take auto)
# A compare takes one sampling scheme for all its PS variants, so every run is its own
# `chorus compare` (one variant, one seed), in seed-major order so that load drift on the
# shared machine hits every variant alike. bench/nups_summary.py then merges the runs of each
# cell (workload x nodes x delay) into one compare folder with the names above, has
# `chorus report` draw its table and quality-vs-time plot, and writes OUT/results.md with what
# the metrics files say per variant (medians over seeds) and the issue's goals, met or missed.
# `single` sends nothing, so it runs once per workload and seed and stands in every cell.
#
# Usage: bench/nups_experiment.sh [--short] [--out DIR] [--cells "kge-n4-d0 ..."]
#          [--max-seeds N] [--seeds N] [--link-delay MS] [--base-port P] [--chorus PATH]
#          [--summarize-only]
#   --short           two epochs of a small Zipf MF and one of WN18RR on 2 nodes, one seed, in
#                     about a minute (a check that every variant runs and the summary is whole)
#   --cells           run only these cells of the grid: WORKLOAD-nNODES-dDELAYED, kge or mf,
#                     4 or 8 nodes, d0 no delay or d1 the link delay (kge-n4-d0 ... mf-n8-d1)
#   --max-seeds N     at most N seeds per cell (the grid says 3 for some, 1 for the others)
#   --seeds N         N seeds in every cell run (seeds 1..N; runs already in OUT are kept), e.g.
#                     to add seeds 2 and 3 to the 1-seed cells: --cells "kge-n8-d0" --seeds 3
#   --link-delay MS   the delay of the *-d1 cells (default 1: every frame waits 1 ms before it
#                     is sent, a data-centre round trip of 2 ms)
#   --base-port P     the N-node topology listens on P + 20 N ... (default 28600)
#   --summarize-only  only merge and summarize what OUT holds
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chorus="${CHORUS:-$here/build/cli/chorus}"
out="runs/nups-experiment"
short=0
summarize_only=0
only_cells=""
max_seeds=3
all_seeds=0
link_delay=1
base_port=28600

while [[ $# -gt 0 ]]; do
  case "$1" in
    --short) short=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --cells) only_cells="$2"; shift 2 ;;
    --max-seeds) max_seeds="$2"; shift 2 ;;
    --seeds) all_seeds="$2"; shift 2 ;;
    --link-delay) link_delay="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --summarize-only) summarize_only=1; shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "nups_experiment.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! -x "$chorus" ]]; then
  echo "nups_experiment.sh: no chorus executable at $chorus; run 'make build' or pass --chorus" >&2
  exit 2
fi
for tool in /usr/bin/python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "nups_experiment.sh: $tool not found" >&2; exit 2; }
done
if [[ ! -f "$here/data/wn18rr/train.txt.gz" ]]; then
  echo "nups_experiment.sh: $here/data/wn18rr/train.txt.gz is missing: it is part of the repository" >&2
  exit 2
fi
[[ $short -eq 1 && "$out" == "runs/nups-experiment" ]] && out="runs/nups-experiment-short"

# The workloads. KGE: the recipe of docs/ml.md and docs/sparse-compare.md (target: node 0's
# valid MRR 0.25, reached after the third epoch on one node); MF: the generated Zipf ratings
# (--data zipf-mf, Zipf 1.1 rows and columns) with 3 million cells instead of 10 so that lapse's
# runs fit the budget (target: test RMSE 0.37, reached after the second epoch on one node).
kge_flags=(--model complex --data wn18rr --data-dir "$here/data" --dim 64 --negatives 256
           --share-negatives --loss ce --reg n3 --reg-weight 0.05 --reciprocal --batch 512
           --eval-every-epochs 1)
kge_epochs=4
kge_target=(--target-mrr 0.25)
mf_flags=(--model mf --data zipf-mf --mf-cells 3000000)
mf_epochs=4
mf_target=(--target-rmse 0.37)
# Cells: name, workload, nodes, delayed (0/1), seeds.
cells=(
  "kge-n4-d0 kge 4 0 3"
  "kge-n4-d1 kge 4 1 3"
  "mf-n4-d0 mf 4 0 3"
  "kge-n8-d0 kge 8 0 1"
  "kge-n8-d1 kge 8 1 1"
  "mf-n4-d1 mf 4 1 1"
  "mf-n8-d0 mf 8 0 1"
  "mf-n8-d1 mf 8 1 1"
)
if [[ $short -eq 1 ]]; then
  # One epoch of WN18RR (its evaluations alone take seconds) and a small MF, 2 nodes, seed 1.
  kge_epochs=1
  kge_target=(--target-mrr 0.01)
  mf_flags=(--model mf --data zipf-mf --mf-rows 2000 --mf-cols 500 --mf-cells 100000)
  mf_epochs=2
  mf_target=(--target-rmse 1.0)
  cells=("kge-n2-d0 kge 2 0 1" "mf-n2-d1 mf 2 1 1")
  max_seeds=1
fi
if ((all_seeds > 0)); then
  for i in "${!cells[@]}"; do cells[i]="${cells[i]% *} $all_seeds"; done
  max_seeds=$all_seeds
fi
if [[ -n "$only_cells" ]]; then
  kept=()
  for c in "${cells[@]}"; do
    name=${c%% *}
    [[ " $only_cells " == *" $name "* ]] && kept+=("$c")
  done
  cells=("${kept[@]}")
  ((${#cells[@]})) || { echo "nups_experiment.sh: --cells '$only_cells' names no cell of the grid" >&2; exit 2; }
fi

# name -> variant of chorus compare and its sampling flags (KGE only).
declare -A variant_of=([classic]=ps:classic [lapse]=ps:lapse [nups]=ps:nups
                       [nups-local]=ps:nups [auto]=ps:auto)
declare -A scheme_of=([classic]="--sample-scheme naive" [lapse]="--sample-scheme preloc"
                      [nups]="--sample-scheme pool --sample-reuse 16"
                      [nups-local]="--sample-scheme onlylocal"
                      [auto]="--sample-scheme pool --sample-reuse 16")
ps_names="classic lapse nups nups-local auto"

# compare parses its variants first and refuses a technique this build does not have; the
# missing topology stops it right after, so the probe runs nothing (as scripts/demo_sparse.sh).
missing_techniques=""
for t in nups auto; do
  probe=$("$chorus" compare --topology /nonexistent/nups-experiment.toml --model complex \
            --variants "ps:$t" --out /nonexistent/nups-experiment 2>&1 || true)
  if [[ "$probe" == *"not implemented yet"* ]]; then
    echo "nups-experiment: ps:$t is not in this build yet ($(grep -o 'usable: [^)]*' <<<"$probe")); its rows are left out"
    missing_techniques+=" $t"
  fi
done

mkdir -p "$out/runs" "$out/topologies"
log="$out/runs.log"

# run CELL NAME SEED WORKLOAD NODES DELAYED: one chorus compare of one variant and seed into
# OUT/runs/CELL/NAME/seed-SEED (single: OUT/runs/single-WORKLOAD/single/seed-SEED). Skips a run
# that finished before (its manifest says ok), so an interrupted grid can be continued and a
# failed run is run again.
run_one() {
  local cell=$1 name=$2 seed=$3 workload=$4 nodes=$5 delayed=$6
  local dir="$out/runs/$cell/$name/seed-$seed"
  grep -qs '"event":"run".*"status":"ok"' "$dir/runs.jsonl" && return 0
  local topo="$out/topologies/n$nodes.toml"
  local cmd=("$chorus" compare --topology "$topo" --seed "$seed" --seeds 1 --force
             --run-timeout 900 --progress-every 30 --out "$dir")
  if [[ $workload == kge ]]; then
    cmd+=("${kge_flags[@]}" --epochs "$kge_epochs" "${kge_target[@]}")
  else
    cmd+=("${mf_flags[@]}" --epochs "$mf_epochs" "${mf_target[@]}")
  fi
  if [[ $name == single ]]; then
    cmd+=(--variants single)
  else
    cmd+=(--variants "${variant_of[$name]}")
    # shellcheck disable=SC2206
    [[ $workload == kge ]] && cmd+=(${scheme_of[$name]})
  fi
  [[ $delayed == 1 ]] && cmd+=(--link-delay "$link_delay")
  mkdir -p "$(dirname "$dir")"
  echo "[$(date -u +%H:%M:%S)] $cell $name seed $seed; load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
  echo "  ${cmd[*]}" >> "$log"
  if ! "${cmd[@]}" > "$dir.out" 2>&1; then
    echo "  failed: $(grep -m1 -E 'error|failed' "$dir.out" || tail -1 "$dir.out")" | tee -a "$log"
  fi
  grep -E 'finished in|failed' "$dir.out" | sed 's/^/  /' | tee -a "$log" || true
}

if [[ $summarize_only -eq 0 ]]; then
  for n in 2 4 8; do
    # Ports of their own, away from the other experiments' (27100-27500) and below Linux's
    # ephemeral range (32768-60999), where an outgoing connection can hold a port for a while.
    "$chorus" topo gen complete --nodes "$n" --base-port $((base_port + 20 * n)) --name "nups-n$n" \
      -o "$out/topologies/n$n.toml" --force > /dev/null
  done
  {
    echo "start: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "host: $(uname -srm), $(nproc) cores; chorus $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "kge: ${kge_flags[*]} --epochs $kge_epochs ${kge_target[*]}"
    echo "mf: ${mf_flags[*]} --epochs $mf_epochs ${mf_target[*]}"
    echo "link delay of the d1 cells: $link_delay ms; cells: ${cells[*]}"
    echo "left out (not in this build):${missing_techniques:- none}"
  } >> "$out/machine.txt"
  for seed in $(seq 1 "$max_seeds"); do
    for c in "${cells[@]}"; do
      read -r cell workload nodes delayed seeds <<<"$c"
      ((seed <= seeds)) || continue
      # One node alone: once per workload and seed (sends nothing: no delay to apply).
      run_one "single-$workload" single "$seed" "$workload" "$nodes" 0
      for name in $ps_names; do
        [[ $name == nups-local && $workload == mf ]] && continue  # MF samples no rows
        [[ " $missing_techniques " == *" ${variant_of[$name]#ps:} "* ]] && continue
        run_one "$cell" "$name" "$seed" "$workload" "$nodes" "$delayed"
      done
    done
  done
  echo "end: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
fi

summary_args=(--chorus "$chorus" --out "$out" --link-delay "$link_delay")
((short)) && summary_args+=(--require-all)
for c in "${cells[@]}"; do summary_args+=(--cell "$c"); done
/usr/bin/python3 "$here/bench/nups_summary.py" "${summary_args[@]}"
