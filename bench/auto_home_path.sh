#!/usr/bin/env bash
# auto's keys at home on classic's path (issue 25): --technique auto of two builds (BEFORE: the
# relocation shell serves the keys at home; AFTER: classic's KvWorker does) against classic and
# nups, WN18RR ComplEx dim 64 on 4 nodes, no link delay, the nups experiment's recipe
# (bench/nups_experiment.sh: auto and nups with pool sampling, reuse 16; classic naive).
# Interleaved: every round runs before-auto, after-auto, classic, nups (each build), so that the
# machine's load drift hits them alike. Prints each run's time to valid MRR 0.25 (node 0's
# training seconds at its first evaluation at the target), training seconds per epoch and the
# load average when it started, and the node processes' resident memory (per node the median of
# samples twice a second, averaged over the nodes); everything is kept under OUT.
#
# Usage: bench/auto_home_path.sh --before CHORUS_BEFORE [--after CHORUS_AFTER] [--rounds N]
#        [--out DIR] [--variants "auto classic nups"]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
before=""
after="$here/build/cli/chorus"
rounds=2
out="runs/auto-home-path"
variants="auto classic nups"
base_port=29300
while [[ $# -gt 0 ]]; do
  case "$1" in
    --before) before="$2"; shift 2 ;;
    --after) after="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "auto_home_path.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$before" && -x "$after" ]] || {
  echo "auto_home_path.sh: --before and --after must name chorus executables" >&2; exit 2; }
mkdir -p "$out"
topo="$out/n4.toml"
"$after" topo gen complete --nodes 4 --base-port "$base_port" --name auto-home -o "$topo" \
  --force > /dev/null
kge=(--model complex --data wn18rr --data-dir "$here/data" --dim 64 --negatives 256
     --share-negatives --loss ce --reg n3 --reg-weight 0.05 --reciprocal --batch 512
     --eval-every-epochs 1 --epochs 4 --target-mrr 0.25)
declare -A scheme=([auto]="--sample-scheme pool --sample-reuse 16"
                   [nups]="--sample-scheme pool --sample-reuse 16"
                   [classic]="--sample-scheme naive")
results="$out/results.tsv"
echo -e "round\tbuild\tvariant\tload\ttime_to_target_s\ttrain_s_per_epoch\tlast_valid_mrr\tnode_rss_mib" > "$results"
for r in $(seq 1 "$rounds"); do
  for v in $variants; do
    for build in before after; do
      bin=$before
      [[ $build == after ]] && bin=$after
      dir="$out/r$r-$build-$v"
      load=$(cut -d' ' -f1 /proc/loadavg)
      # shellcheck disable=SC2206
      cmd=("$bin" compare --topology "$topo" --seed 1 --seeds 1 --force --run-timeout 900
           --out "$dir" "${kge[@]}" --variants "ps:$v" ${scheme[$v]})
      echo "[$(date -u +%H:%M:%S)] round $r $build $v, load $load" >&2
      "${cmd[@]}" > "$dir.out" 2>&1 &
      run_pid=$!
      # Every node process's resident memory, twice a second, while the run lasts.
      /usr/bin/python3 - "$run_pid" > "$dir.rss" <<'EOF_RSS' &
import os, sys, time
root = int(sys.argv[1])
def children(pid):
    # A child belongs to the thread that forked it: every thread's list.
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out
while os.path.exists(f"/proc/{root}"):
    todo, seen = [root], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    for p in seen:
        try:
            cmd = open(f"/proc/{p}/cmdline").read().split("\0")
            if len(cmd) > 1 and cmd[1] == "node":
                for line in open(f"/proc/{p}/status"):
                    if line.startswith("VmRSS:"):
                        print(p, int(line.split()[1]), flush=True)
        except OSError:
            pass
    time.sleep(0.5)
EOF_RSS
      wait "$run_pid" || echo "  failed: $(tail -1 "$dir.out")" >&2
      wait
      /usr/bin/python3 - "$dir" "$r" "$build" "$v" "$load" >> "$results" <<'EOF'
import csv, glob, json, sys
d, r, build, v, load = sys.argv[1:]
ttt, per_epoch, mrr = "", "", ""
for path in glob.glob(f"{d}/**/summary.csv", recursive=True):
    for row in csv.DictReader(open(path)):
        if row.get("reached_target") == "1":
            ttt = row.get("time_to_target_s", "")
epochs = []
for path in glob.glob(f"{d}/**/node-0*.jsonl", recursive=True):
    for line in open(path):
        e = json.loads(line)
        if e.get("event") == "epoch":
            epochs.append(e.get("epoch_seconds", 0))
            mrr = e.get("valid_mrr", mrr)
if epochs:
    per_epoch = f"{sum(epochs) / len(epochs):.3f}"
# Resident memory: per node process the median of its samples, then the mean over the nodes.
by_pid = {}
for line in open(f"{d}.rss"):
    pid, kb = line.split()
    by_pid.setdefault(pid, []).append(int(kb))
medians = [sorted(v)[len(v) // 2] for v in by_pid.values() if len(v) >= 3]
rss = f"{sum(medians) / len(medians) / 1024:.1f}" if medians else ""
print(f"{r}\t{build}\t{v}\t{load}\t{ttt}\t{per_epoch}\t{mrr}\t{rss}")
EOF
      tail -1 "$results" >&2
    done
  done
done
column -t "$results"
