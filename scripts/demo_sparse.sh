#!/usr/bin/env bash
# The README's third command: PS mode's techniques against consensus mode's sparse gossip on a
# knowledge graph. Four nodes on this machine train ComplEx embeddings of WN18RR (data/wn18rr,
# in the repository) on their quarter of the triples; `chorus compare` runs each variant in
# turn, finds when node 0's validation MRR first reached the target, and prints the table; the
# plots land in runs/demo-sparse/plots/.
#
# Usage: scripts/demo_sparse.sh [--short] [CHORUS_BINARY]
#   --short  one epoch instead of five, into runs/demo-sparse-short (CI runs it: about a
#            minute); fails unless every variant ran and the table is complete.
set -euo pipefail
short=0
if [[ "${1:-}" == "--short" ]]; then
  short=1
  shift
fi
chorus=${1:-build/cli/chorus}
cd "$(dirname "$0")/.."
if [[ ! -f data/wn18rr/train.txt.gz ]]; then
  echo "demo-sparse: data/wn18rr/train.txt.gz is missing: it is part of the repository" >&2
  exit 2
fi
# Every technique of issue 25 (auto, the default, chooses each key's technique itself; nups
# with its default hot set), then sparse gossip.
variants=single,ps:classic,ps:lapse,ps:nups,ps:auto,consensus:wait-all,consensus:dynamic
out=runs/demo-sparse
epochs=(--epochs 5)
target=0.25
if ((short)); then
  out=runs/demo-sparse-short
  epochs=(--epochs 1)
  target=0.05
fi
cmd=("$chorus" compare --topology examples/topologies/demo4.toml
     --model complex --data wn18rr --dim 64 --negatives 256 --share-negatives --loss ce
     --reg n3 --reg-weight 0.05 --reciprocal --batch 512 "${epochs[@]}" --eval-every-epochs 1
     --target-mrr "$target" --variants "$variants" --out "$out" --force)
echo "demo-sparse: ${cmd[*]}"
"${cmd[@]}"
# The table must hold every variant, each with its run finished.
missing=()
for v in ${variants//,/ }; do
  grep -q "^| $v | 1/1 |" "$out/report.md" 2>/dev/null || missing+=("$v")
done
if ((${#missing[@]})); then
  echo "demo-sparse: error: $out/report.md lacks a finished run of: ${missing[*]}" >&2
  exit 1
fi
echo "demo-sparse: all ${variants//,/, } finished; table in $out/report.md"
