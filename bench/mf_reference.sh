#!/usr/bin/env bash
# chorus's matrix factorization against its PyTorch reference (bench/mf_reference.py) on the same
# ratings: chorus generates the Zipf-skewed data, trains on it and writes it (--write-data); the
# reference trains on those files with the same model, loss, optimizer, hyper-parameters and
# epochs. Prints both test RMSEs (and their relative difference, target within 2%), the noise
# floor, and both training speeds on one thread (target: chorus at least 5x the reference's),
# by wall time and by CPU time (on a shared machine the CPU-time ratio is the steadier one).
#
# Usage: bench/mf_reference.sh [--out DIR] [--epochs N] [--rank R] [--reg L] [--lr LR]
#          [--batch B] [--optimizer adagrad|sgd] [--seed S] [-- <more chorus train flags>]
# The flags after -- go to chorus only and must not change the training (generator flags such
# as --mf-rows, --mf-cells, --noise-sigma). Defaults: chorus train's MF defaults; out
# runs/mf-reference. CHORUS overrides the binary (default build/cli/chorus), PYTHON the
# interpreter (default /usr/bin/python3, with Debian's python3-torch).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chorus="${CHORUS:-$here/build/cli/chorus}"
python="${PYTHON:-/usr/bin/python3}"
out="runs/mf-reference"
epochs=10
rank=16
reg=0.001
lr=0.1
batch=1000
optimizer=adagrad
seed=1
init_std=0.1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --rank) rank="$2"; shift 2 ;;
    --reg) reg="$2"; shift 2 ;;
    --lr) lr="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --optimizer) optimizer="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "mf_reference.sh: unknown option $1 (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
done
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "mf_reference.sh: $python cannot import torch: apt-get install python3-torch" >&2
  exit 2
fi
mkdir -p "$out"
hyper=(--rank "$rank" --reg "$reg" --lr "$lr" --batch "$batch" --optimizer "$optimizer"
       --epochs "$epochs" --seed "$seed" --init-std "$init_std")

echo "== chorus: $chorus train --model mf --data zipf-mf ${hyper[*]} ${extra[*]:-}"
"$chorus" train --model mf --data zipf-mf "${hyper[@]}" "${extra[@]}" --write-data "$out/data" \
  --out "$out/chorus.jsonl" | tee "$out/chorus.txt"
echo "== reference: $python bench/mf_reference.py --data $out/data ${hyper[*]}"
"$python" "$here/bench/mf_reference.py" --data "$out/data" "${hyper[@]}" > "$out/reference.json"

"$python" - "$out/chorus.jsonl" "$out/reference.json" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
summary = next(e for e in events if e["event"] == "summary")
ref = json.load(open(sys.argv[2]))
c_rmse, r_rmse = summary["test_rmse"], ref["test_rmse"]
sigma = summary["noise_sigma"]
diff = abs(c_rmse - r_rmse) / c_rmse
speed = summary["samples_per_s"] / ref["samples_per_s"]
cpu_speed = summary["samples_per_cpu_s"] / ref["samples_per_cpu_s"]
print(f"noise floor (sigma): {sigma:.4f}")
print(f"test RMSE   chorus {c_rmse:.4f} ({c_rmse / sigma:.3f} x floor), "
      f"reference {r_rmse:.4f} ({r_rmse / sigma:.3f} x floor): differ by {100 * diff:.2f}% "
      f"(target <= 2%: {'met' if diff <= 0.02 else 'missed'})")
print(f"ratings/s   chorus {summary['samples_per_s']:.0f}, reference {ref['samples_per_s']:.0f} "
      f"(torch {ref['torch']}, {ref['threads']} thread): chorus {speed:.1f}x "
      f"(target >= 5x: {'met' if speed >= 5 else 'missed'})")
print(f"per CPU s   chorus {summary['samples_per_cpu_s']:.0f}, reference "
      f"{ref['samples_per_cpu_s']:.0f}: chorus {cpu_speed:.1f}x (target >= 5x: "
      f"{'met' if cpu_speed >= 5 else 'missed'})")
print(f"training    chorus {summary['train_seconds']:.1f} s, reference {ref['train_seconds']:.1f} s "
      f"for {ref['epochs']} epochs")
PY
