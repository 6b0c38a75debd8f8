#!/usr/bin/env bash
# How long a cluster takes to connect, and where the time goes (issue 27 "Scale limits",
# docs/soak.md): `chorus launch` starts N nodes on this machine for a run of a few steps, and
# from each node's log this script takes the moment it listened (its "listening on" line) and
# its "connected to all K peers in T ms" line (T counts from just before it listened). Per node
# count it prints one Markdown row:
#   - slowest node's T (what the ready time-out is measured against),
#   - listen spread: from the first node's listen to the last one's (process start and data
#     loading on a shared machine; no network is involved yet),
#   - after the last listen: from the last node's listen to the last node connected (dialing,
#     backoff after refused attempts, handshakes): the network's own share.
#
# Usage: bench/connect_time.sh [--nodes "16 32 64"] [--mode ps|consensus] [--data mnist]
#          [--rounds 2] [--chorus PATH] [--data-dir DIR] [--out DIR] [-- EXTRA node options]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_counts="16 32 64"
mode=ps
data=mnist
rounds=2
chorus="${CHORUS:-$here/build/cli/chorus}"
data_dir="${CHORUS_MNIST:-$here/../shared/datasets/mnist}"
out="runs/connect"
extra=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) node_counts="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --chorus) chorus="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "connect_time.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$chorus" ]] || { echo "connect_time.sh: no chorus binary at $chorus (build first)" >&2; exit 2; }
mkdir -p "$out"

echo "| nodes | mode | slowest node connected after, s | listen spread (first to last listen), s | after the last listen, s | load |"
echo "| ---: | --- | ---: | ---: | ---: | --- |"
for n in $node_counts; do
  run="$out/$mode-$n"
  rm -rf "$run"; mkdir -p "$run"
  base=$(/usr/bin/python3 "$here/bench/soak.py" ports --count "$n")
  "$chorus" topo gen ring --nodes "$n" --mode "$mode" --base-port "$base" -o "$run/ring.toml" \
      > /dev/null 2>&1
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  data_opts=(--data "$data")
  [[ $data == synthetic ]] || data_opts+=(--data-dir "$data_dir")
  status=0
  "$chorus" launch "$run/ring.toml" --mode "$mode" "${data_opts[@]}" --model mlp \
      --rounds "$rounds" --eval-every 0 --out "$run" "${extra[@]}" > "$run/launch.log" 2>&1 \
      || status=$?
  if [[ $status -ne 0 ]]; then
    echo "connect_time.sh: $n nodes failed (exit $status); see $run/launch.log" >&2
    continue
  fi
  # "[node 3] [14:20:01.123] [info] listening on ..." and "[node 3] node 3 of cluster ...:
  # connected to all 63 peers in 812 ms; ...".
  /usr/bin/python3 - "$run/launch.log" "$n" "$mode" "$load" <<'EOF'
import re, sys
log, n, mode, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
listen, ready = {}, {}
for line in open(log, errors="replace"):
    m = re.match(r"\[node (\d+)\] \[(\d+):(\d+):(\d+)\.(\d+)\] \[info\] listening on", line)
    if m:
        h, mi, s, ms = map(int, m.group(2, 3, 4, 5))
        listen[int(m.group(1))] = h * 3600 + mi * 60 + s + ms / 1000
    m = re.match(r"\[node (\d+)\] node \d+ of cluster .*connected to all \d+ peers in (\d+) ms", line)
    if m:
        ready[int(m.group(1))] = int(m.group(2)) / 1000
if len(listen) != n or len(ready) != n:
    sys.exit(f"connect_time.sh: {len(listen)} listen and {len(ready)} connected lines of {n} nodes in {log}")
last_listen = max(listen.values())
done = max(listen[i] + ready[i] for i in listen)
print(f"| {n} | {mode} | {max(ready.values()):.1f} | {last_listen - min(listen.values()):.1f} | "
      f"{done - last_listen:.1f} | {load} |")
EOF
done
