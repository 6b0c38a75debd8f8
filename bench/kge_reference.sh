#!/bin/bash
# chorus against the PyTorch reference (bench/kge_reference.py) on the same KGE training: same
# model, loss, negative sampler, regularizer, optimizer, hyper-parameters and epochs, one thread
# each, run one after the other. Prints both results and the ratios (triples/s, MRR difference).
#
# Usage: bench/kge_reference.sh [DATA_DIR] [EPOCHS] [extra flags for both, e.g. --dim 200]
#   DATA_DIR defaults to data/wn18rr in the source tree, EPOCHS to 2.
# Needs Debian's python3-torch (apt-get install python3-torch), run with /usr/bin/python3.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
data="${1:-$root/data/wn18rr}"
epochs="${2:-2}"
shift $(($# > 2 ? 2 : $#))
chorus="${CHORUS:-$root/build/cli/chorus}"
[ -x "$chorus" ] || { echo "no chorus binary at $chorus (build it, or set CHORUS)" >&2; exit 2; }
[ -f "$data/train.txt" ] || { echo "no triples in $data (pass the WN18RR folder)" >&2; exit 2; }

# The configuration compared: sampled negatives (the sparse path), RotatE's self-adversarial
# logistic loss, N3, AdaGrad. Flags after EPOCHS override these (both programs take them).
flags=(--model complex --dim 200 --negatives 256 --loss logistic --adversarial-temperature 1
       --reg n3 --reg-weight 0.001 --optimizer adagrad --lr 0.1 --batch 512 --init-scale 0.001
       --seed 1 "$@")
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== chorus: $chorus train --data wn18rr --data-dir $data --epochs $epochs ${flags[*]}"
"$chorus" train --data wn18rr --data-dir "$data" --epochs "$epochs" --eval-every 0 "${flags[@]}" \
  --out "$out/chorus.jsonl" 2> >(grep -v '^epoch .* step ' >&2) | tee "$out/chorus.txt"
echo "== PyTorch: /usr/bin/python3 $here/kge_reference.py --data-dir $data --epochs $epochs ${flags[*]}"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/kge_reference.py" --data-dir "$data" --epochs "$epochs" \
  --threads 1 "${flags[@]}" | tee "$out/torch.txt"

/usr/bin/python3 - "$out" <<'EOF'
import json, re, sys
out = sys.argv[1]
summary = [json.loads(l) for l in open(f"{out}/chorus.jsonl") if '"summary"' in l][-1]
torch = dict(kv.split("=") for kv in
             [l for l in open(f"{out}/torch.txt") if l.startswith("RESULT ")][-1].split()[1:])
c_rate, t_rate = summary["points_per_s"], float(torch["triples_per_s"])
print()
print("| | chorus | PyTorch | chorus / PyTorch |")
print("| --- | ---: | ---: | ---: |")
print(f"| training triples/s (one thread) | {c_rate:,.0f} | {t_rate:,.0f} | {c_rate / t_rate:.1f}x |")
for split in ("valid", "test"):
    c, t = summary[f"{split}_mrr"], float(torch[f"{split}_mrr"])
    print(f"| {split} filtered MRR | {c:.4f} | {t:.4f} | {c - t:+.4f} |")
EOF
