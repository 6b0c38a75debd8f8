#!/usr/bin/env bash
# Peak memory per node (issue 27, docs/memory.md): `chorus launch` runs N nodes of a ring on
# this machine training the MNIST mlp for a few steps, and a sampler reads every node process's
# VmHWM (the kernel's high-water mark of its resident set) from /proc every 0.2 s until it
# exits; the last reading of each is its peak (VmHWM only grows). Prints one Markdown row per
# node count: min / median / max over the nodes, their sum, and the launcher's own peak.
#
# Usage: bench/memory_per_node.sh [--nodes "4 16 64"] [--mode consensus|ps] [--rounds R]
#          [--data mnist] [--model mlp] [--chorus PATH] [--data-dir DIR] [--out DIR]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_counts="4 16 64"
mode=consensus
rounds=20
data=mnist
model=mlp
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
out="runs/memory"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) node_counts="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "memory_per_node.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$chorus" ]] || { echo "memory_per_node.sh: no chorus binary at $chorus (build first)" >&2; exit 2; }
mkdir -p "$out"

# Every 0.2 s until the launcher exits: the VmHWM (kB) of the launcher and of each of its
# children (`chorus node --spec FILE --id N`), keyed by node id; the last reading is the peak.
sample() {  # sample LAUNCHER_PID TABLE_FILE
  local launcher=$1 table=$2
  declare -A peak=()
  local pid key k v rest i
  local -a args
  # Shell builtins only inside the loop: forking per process per reading is too slow on a
  # loaded machine with 64 nodes.
  hwm_of() {  # hwm_of PID -> $v (kB) or empty
    v=""
    while read -r k v rest; do [[ $k == VmHWM: ]] && return 0; done < "/proc/$1/status"
    v=""
  } 2>/dev/null
  while kill -0 "$launcher" 2>/dev/null; do
    hwm_of "$launcher" && [[ -n "$v" ]] && peak[launcher]=$v
    for pid in $(pgrep -P "$launcher" || true); do
      mapfile -d '' args 2>/dev/null < "/proc/$pid/cmdline" || continue
      key=""
      for ((i = 0; i + 1 < ${#args[@]}; ++i)); do
        [[ ${args[i]} == --id ]] && key="node-${args[i + 1]}"
      done
      [[ -n "$key" ]] || continue
      hwm_of "$pid" && [[ -n "$v" ]] && peak[$key]=$v
    done
    sleep 0.2
  done
  for key in "${!peak[@]}"; do echo "$key ${peak[$key]}"; done | sort > "$table"
}

echo "| nodes | mode | peak RSS per node, MB (min / median / max) | all nodes, MB | launcher, MB | load |"
echo "| ---: | --- | ---: | ---: | ---: | --- |"
for n in $node_counts; do
  run="$out/$mode-$n"
  rm -rf "$run"; mkdir -p "$run"
  "$chorus" topo gen ring --nodes "$n" -o "$run/ring.toml" > /dev/null 2>&1
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  "$chorus" launch "$run/ring.toml" --mode "$mode" --data "$data" --data-dir "$data_dir" \
      --model "$model" --rounds "$rounds" --eval-every 0 --out "$run" > "$run/launch.log" 2>&1 &
  launcher=$!
  sample "$launcher" "$run/peaks.txt" &
  sampler=$!
  status=0
  wait "$launcher" || status=$?
  wait "$sampler"
  if [[ $status -ne 0 ]]; then
    echo "memory_per_node.sh: $n nodes failed (exit $status); see $run/launch.log" >&2
    continue
  fi
  launcher_kb=$(awk '$1 == "launcher" {print $2}' "$run/peaks.txt")
  # Node peaks in kB, ascending.
  mapfile -t peaks < <(awk '$1 != "launcher" {print $2}' "$run/peaks.txt" | sort -n)
  k=${#peaks[@]}
  if [[ $k -ne $n ]]; then echo "memory_per_node.sh: sampled $k of $n nodes" >&2; fi
  [[ $k -gt 0 ]] || continue
  sum=0; for v in "${peaks[@]}"; do sum=$((sum + v)); done
  awk -v n="$n" -v mode="$mode" -v load="$load" -v lo="${peaks[0]}" \
      -v mid="${peaks[$(((k - 1) / 2))]}" -v hi="${peaks[$((k - 1))]}" -v sum="$sum" \
      -v launcher="${launcher_kb:-0}" 'BEGIN {
    printf "| %d | %s | %.0f / %.0f / %.0f | %.0f | %.0f | %s |\n", n, mode, lo / 1024,
           mid / 1024, hi / 1024, sum / 1024, launcher / 1024, load }'
done
