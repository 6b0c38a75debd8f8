#!/usr/bin/env bash
# The README's main command: PS mode against consensus mode (and one node alone) on the same
# work. Four nodes on this machine train the mlp on Fashion-MNIST (Debian's
# dataset-fashion-mnist, installed by scripts/setup.sh) with one node three times slower and
# random delays on every step; `chorus compare` runs each variant in turn and prints the
# table; the plots land in runs/demo/plots/.
#
# Usage: scripts/demo.sh [--short] [CHORUS_BINARY]
#   --short  the same command with 40 rounds instead of 2 epochs (CI runs it: about a minute),
#            into runs/demo-short; fails unless every variant ran and the table is complete.
set -euo pipefail
short=0
if [[ "${1:-}" == "--short" ]]; then
  short=1
  shift
fi
chorus=${1:-build/cli/chorus}
cd "$(dirname "$0")/.."
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -d "$data_dir" ]]; then
  echo "demo: $data_dir is missing; run 'bash scripts/setup.sh' as root (it installs" >&2
  echo "      Debian's dataset-fashion-mnist)" >&2
  exit 2
fi
variants=single,ps:bsp,ps:ssp:2,consensus:wait-all,consensus:dynamic
out=runs/demo
length=(--epochs 2 --eval-every 20)
if ((short)); then
  out=runs/demo-short
  length=(--rounds 40 --eval-every 10)
fi
cmd=("$chorus" compare --topology examples/topologies/demo4.toml
     --data fashion-mnist --data-dir "$data_dir" --model mlp "${length[@]}" --batch 64 --lr 0.05
     --momentum 0.9 --stragglers shifted-exp:5,15+slow:3=3 --target-acc 0.84
     --variants "$variants" --out "$out" --force)
echo "demo: ${cmd[*]}"
"${cmd[@]}"
# The table must hold every variant, each with its run finished.
missing=()
for v in ${variants//,/ }; do
  grep -q "^| $v | 1/1 |" "$out/report.md" 2>/dev/null || missing+=("$v")
done
if ((${#missing[@]})); then
  echo "demo: error: $out/report.md lacks a finished run of: ${missing[*]}" >&2
  exit 1
fi
echo "demo: all ${variants//,/, } finished; table in $out/report.md"
