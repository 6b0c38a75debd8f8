#!/usr/bin/env bash
# Runs every Google Benchmark program of a build tree. Each program measures its own baseline
# in the same run (memcpy, raw sockets, Eigen GEMM) and reports the ratio as a counter.
# Usage: scripts/bench.sh [BUILD_DIR] [extra benchmark flags...]
set -euo pipefail
build=${1:-build}
shift || true
mapfile -t programs < <(find "$build/bench" -type f -executable -name 'bench_*' | sort)
if [ ${#programs[@]} -eq 0 ]; then
  echo "bench: no benchmark programs under $build/bench (configure with -DCHORUS_BUILD_BENCH=ON)" >&2
  exit 1
fi
for p in "${programs[@]}"; do
  echo "== $p"
  "$p" --benchmark_counters_tabular=true "$@"
done
