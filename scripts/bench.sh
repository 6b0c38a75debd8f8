#!/usr/bin/env bash
# Runs every Google Benchmark program of a build tree (bench_ml, bench_node, bench_ps). Each
# program measures its own baseline in the same run (memcpy, raw sockets, Eigen GEMM; bench_ps
# a raw TCP socket pair and a bare epoll request/reply pair moving the same bytes as the PS
# push/pull) and reports the ratios.
# Figures and the commands behind them: bench/README.md.
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
