#!/usr/bin/env bash
# Soak (issue 27, docs/soak.md): N nodes of each mode train the dense MNIST mlp for a set time
# under stragglers and link loss, while every few minutes a random node is killed with
# SIGKILL (a crashed machine) and, some seconds later, restarted with --rejoin into the
# running job (both modes can: consensus takes a neighbor's model, PS gets its keys back from
# a live node's last read). Every 10 s a sampler (bench/soak.py) records each node process's
# resident set, open fds and TCP connections from /proc into OUT/MODE/samples.csv; at the end
# it prints per node the growth from minute 5 of each process's life to its end, a verdict
# (flat or growing), and plots the three against time into OUT/soak-MODE.png.
#
# Usage: bench/soak.sh [--nodes 16] [--minutes 30] [--modes "consensus ps"] [--parallel]
#          [--crash-every-min 4] [--down-s 20] [--quiet-end-min 3] [--warmup-min 5]
#          [--stragglers PROFILE] [--link-loss P] [--data mnist] [--model mlp]
#          [--nice 10] [--seed 1] [--chorus PATH] [--data-dir DIR] [--out DIR] [--plot-dir DIR]
#          [--check] [-- EXTRA chorus node OPTIONS]
# --parallel runs the modes at the same time (each for --minutes) instead of one after the
# other. --check (the CTest's short form) checks the CSV instead of judging growth. Exit
# status: 0 flat (or --check sane), 1 growing (or a failed check), 2 a run that did not work.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nodes=16
minutes=30
modes="consensus ps"
parallel=0
crash_every_min=4
down_s=20
quiet_end_min=3
warmup_min=5
# Every step waits 50 ms + Exp(50 ms), and one step in 200 starts a 20-step spell 4x slower:
# stragglers, and a pace that 32 nodes on a shared 2-core machine can keep.
stragglers="shifted-exp:50,50+transient:0.005,20,4"
link_loss="0.005"
data=mnist
model=mlp
nice_level=10
seed=1
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
out="runs/soak"
plot_dir=""
check=0
extra=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    --parallel) parallel=1; shift ;;
    --crash-every-min) crash_every_min="$2"; shift 2 ;;
    --down-s) down_s="$2"; shift 2 ;;
    --quiet-end-min) quiet_end_min="$2"; shift 2 ;;
    --warmup-min) warmup_min="$2"; shift 2 ;;
    --stragglers) stragglers="$2"; shift 2 ;;
    --link-loss) link_loss="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --nice) nice_level="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --plot-dir) plot_dir="$2"; shift 2 ;;
    --check) check=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$chorus" ]] || { echo "soak.sh: no chorus binary at $chorus (build first)" >&2; exit 2; }
[[ $nodes -ge 2 ]] || { echo "soak.sh: --nodes must be at least 2 (node 0 is never killed)" >&2; exit 2; }
py=/usr/bin/python3
soak_py="$here/bench/soak.py"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
[[ -n "$plot_dir" ]] || plot_dir="$out"
mkdir -p "$plot_dir"

# Seconds since the epoch, fractional.
now() { date +%s.%N; }
# The pid of node ID's process among the children of the launchers listed in FILE, if alive.
node_pid() {  # node_pid LAUNCHERS_FILE ID
  local launcher pid i
  local -a args
  while read -r launcher; do
    for pid in $(pgrep -P "$launcher" 2>/dev/null || true); do
      mapfile -d '' args 2>/dev/null < "/proc/$pid/cmdline" || continue
      for ((i = 0; i + 1 < ${#args[@]}; ++i)); do
        if [[ ${args[i]} == --id && ${args[i + 1]} == "$2" ]]; then echo "$pid"; return 0; fi
      done
    done
  done < "$1"
  return 1
}

run_mode() {  # run_mode MODE -> 0 flat/sane, 1 growing/insane, 2 failed
  local mode=$1
  local dir="$out/$mode"
  rm -rf "$dir"; mkdir -p "$dir/metrics"
  local launchers="$dir/launchers" events="$dir/events.csv" samples="$dir/samples.csv"
  : > "$launchers"
  echo "time_s,mode,event,node" > "$events"
  local base
  base=$("$py" "$soak_py" ports --count "$nodes")
  "$chorus" topo gen ring --nodes "$nodes" --mode "$mode" --base-port "$base" \
      --name "soak-$mode" -o "$dir/topology.toml" --force > /dev/null
  # The same options for the first start and every restart. --rounds is out of reach: the
  # soak ends by SIGTERM, after which every node leaves in order. An evaluation now and then
  # keeps that path in the soak without making it the main load.
  local -a opts=(--mode "$mode" --data "$data" --model "$model"
                 --rounds 100000000 --eval-every 500 --log-every 1000 --seed "$seed"
                 --stragglers "$stragglers" --out "$dir/metrics")
  [[ $data == synthetic ]] || opts+=(--data-dir "$data_dir")
  [[ -n "$link_loss" && "$link_loss" != 0 ]] && opts+=(--link-loss "$link_loss")
  opts+=("${extra[@]}")
  local start end
  start=$(now)
  end=$(awk -v s="$start" -v m="$minutes" 'BEGIN { printf "%.0f", s + m * 60 }')
  # --keep-going: a node killed by the soak must not make the launcher stop the others.
  nice -n "$nice_level" "$chorus" launch "$dir/topology.toml" --keep-going "${opts[@]}" \
      > "$dir/launch.log" 2>&1 &
  echo $! >> "$launchers"
  nice -n "$nice_level" "$py" "$soak_py" sample --launchers "$launchers" --start "$start" \
      --mode "$mode" --out "$samples" --stop "$dir/stop" &
  local sampler=$!
  echo "soak.sh: $mode: $nodes nodes on ports $base.., $minutes min, logs in $dir" >&2

  # Crashes: every --crash-every-min a random node other than node 0 (the evaluator and the
  # root of the end-of-run tree, whose loss would end the run's report), then its restart
  # after --down-s seconds, until --quiet-end-min before the end, so that the last readings
  # are of a whole cluster.
  RANDOM=$seed
  local next victim pid restarts=0 t scheduled=0
  local every_s last_crash
  every_s=$(awk -v c="$crash_every_min" 'BEGIN { printf "%.0f", c * 60 }')
  next=$(awk -v s="$start" -v c="$every_s" 'BEGIN { printf "%.0f", s + c }')
  last_crash=$(awk -v e="$end" -v q="$quiet_end_min" -v d="$down_s" \
      'BEGIN { printf "%.0f", e - q * 60 - d }')
  while (( every_s > 0 && next <= last_crash )); do
    scheduled=$((scheduled + 1))
    while (( $(date +%s) < next )); do sleep 1; done
    victim=$(( 1 + RANDOM % (nodes - 1) ))
    if pid=$(node_pid "$launchers" "$victim"); then
      kill -9 "$pid" 2>/dev/null || true
      t=$(awk -v n="$(now)" -v s="$start" 'BEGIN { printf "%.1f", n - s }')
      echo "$t,$mode,crash,$victim" >> "$events"
      echo "soak.sh: $mode: killed node $victim (pid $pid) at ${t} s" >&2
      sleep "$down_s"
      restarts=$((restarts + 1))
      nice -n "$nice_level" "$chorus" launch "$dir/topology.toml" --ids "$victim" --rejoin \
          "${opts[@]}" > "$dir/rejoin-$restarts-node-$victim.log" 2>&1 &
      echo $! >> "$launchers"
      t=$(awk -v n="$(now)" -v s="$start" 'BEGIN { printf "%.1f", n - s }')
      echo "$t,$mode,rejoin,$victim" >> "$events"
    else
      echo "soak.sh: $mode: node $victim has no live process to kill at $(date +%T); skipped" >&2
    fi
    next=$(( next + every_s ))
  done
  while (( $(date +%s) < end )); do sleep 1; done

  # The end: SIGTERM to every launcher (each passes it to its node, which leaves in order).
  touch "$dir/stop"
  wait "$sampler" || true
  local launcher alive
  while read -r launcher; do kill -TERM "$launcher" 2>/dev/null || true; done < "$launchers"
  for _ in $(seq 60); do
    alive=0
    while read -r launcher; do kill -0 "$launcher" 2>/dev/null && alive=1; done < "$launchers"
    (( alive )) || break
    sleep 1
  done
  while read -r launcher; do kill -KILL "$launcher" 2>/dev/null || true; done < "$launchers"
  wait 2>/dev/null || true

  local status=0
  if (( check )); then
    "$py" "$soak_py" check --csv "$samples" --events "$events" --nodes "$nodes" \
        --crashes "$scheduled" --rejoin-logs "$dir" \
        > "$dir/verdict.txt" 2>&1 || status=$?
  else
    "$py" "$soak_py" verdict --csv "$samples" --events "$events" --warmup-min "$warmup_min" \
        --plot "$plot_dir/soak-$mode.png" \
        --title "soak: $nodes $mode nodes, $model on $data, $minutes min; stragglers $stragglers, link loss $link_loss" \
        > "$dir/verdict.txt" 2>&1 || status=$?
  fi
  cat "$dir/verdict.txt"
  return "$status"
}

worst=0
if (( parallel )); then
  pids=()
  for mode in $modes; do run_mode "$mode" > "$out/$mode.out" 2>&1 & pids+=($!); done
  i=0
  for mode in $modes; do
    s=0; wait "${pids[i]}" || s=$?
    cat "$out/$mode.out"
    (( s > worst )) && worst=$s
    i=$((i + 1))
  done
else
  for mode in $modes; do
    s=0; run_mode "$mode" || s=$?
    (( s > worst )) && worst=$s
  done
fi
exit "$worst"
