#!/usr/bin/env bash
# Runs the whole test suite several times in a row with ctest -j (more tests at once than the
# machine has cores: that is the load under which timing assumptions break) and says what failed
# in which run, with the machine's load average sampled during the runs (docs/testing.md).
#
# Usage: bash scripts/repeat_suite.sh [--build DIR] [--times N] [--jobs J] [--only REGEX] [--out DIR]
#   --build DIR  the configured and built tree (default: build)
#   --times N    how many runs (default: 5)
#   --jobs J     ctest -j (default: 4)
#   --only REGEX only the tests whose names match (ctest -R), to repeat a suspect
#   --out DIR    where each run's ctest output and failure list go (default: a fresh folder
#                under /tmp, named at the end)
# Exit status: 0 when every run passed, 1 when a test failed in some run, 2 on bad usage.
set -uo pipefail

build=build
times=5
jobs=4
out=""
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --times) times="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --only) only=(-R "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "repeat_suite: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "repeat_suite: $build is not a built tree (cmake -S . -B $build && cmake --build $build)" >&2
  exit 2
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/repeat-suite-XXXXXX)
mkdir -p "$out"

# One sample of the 1-minute load average every 5 s while the runs go on.
( while true; do cut -d' ' -f1 /proc/loadavg; sleep 5; done ) > "$out/load.txt" &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

echo "repeat_suite: $times run(s) of ctest --test-dir $build -j$jobs on $(nproc) core(s); logs in $out"
failed_runs=0
for i in $(seq 1 "$times"); do
  start=$(date +%s)
  rm -f "$build/Testing/Temporary/LastTestsFailed.log"
  ctest --test-dir "$build" -j"$jobs" --output-on-failure --timeout 900 "${only[@]}" > "$out/run-$i.log" 2>&1
  rc=$?
  total=$(grep -o 'out of [0-9]*' "$out/run-$i.log" | tail -1 | cut -d' ' -f3)
  line="run $i: exit $rc, ${total:-?} tests, $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -f "$build/Testing/Temporary/LastTestsFailed.log" ]; then
    cp "$build/Testing/Temporary/LastTestsFailed.log" "$out/failed-$i.txt"
    line="$line; failed: $(cut -d: -f2 "$out/failed-$i.txt" | cut -d' ' -f1 | paste -sd' ')"
  fi
  [ "$rc" -eq 0 ] || failed_runs=$((failed_runs + 1))
  echo "$line"
done
kill $sampler 2>/dev/null
awk '{ s += $1; if (min == "" || $1 < min) min = $1; if ($1 > max) max = $1; n++ }
     END { if (n) printf "load average (1 min) during the runs: min %.1f, mean %.1f, max %.1f (%d samples)\n", min, s / n, max, n }' \
  "$out/load.txt"
echo "repeat_suite: $failed_runs of $times run(s) had a failure (each failure's output: $out/run-N.log)"
[ "$failed_runs" -eq 0 ]
