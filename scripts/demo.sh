#!/usr/bin/env bash
# The README's main command: PS mode against consensus mode (and one node alone) on the same
# work. Four nodes on this machine train the mlp on Fashion-MNIST (Debian's
# dataset-fashion-mnist, installed by scripts/setup.sh) with one node three times slower and
# random delays on every step; `chorus compare` runs each variant in turn and prints the
# table; the plots land in runs/demo/plots/.
set -euo pipefail
chorus=${1:-build/cli/chorus}
cd "$(dirname "$0")/.."
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -d "$data_dir" ]]; then
  echo "demo: $data_dir is missing; run 'bash scripts/setup.sh' as root (it installs" >&2
  echo "      Debian's dataset-fashion-mnist)" >&2
  exit 2
fi
cmd=("$chorus" compare --topology examples/topologies/demo4.toml
     --data fashion-mnist --data-dir "$data_dir" --model mlp --epochs 2 --batch 64 --lr 0.05
     --momentum 0.9 --stragglers shifted-exp:5,15+slow:3=3 --target-acc 0.84 --eval-every 20
     --variants single,ps:bsp,ps:ssp:2,consensus:wait-all,consensus:dynamic
     --out runs/demo --force)
echo "demo: ${cmd[*]}"
"${cmd[@]}"
