#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for a while (docs/fuzzing.md). `make fuzz` builds
# them first; this script only runs them.
#   scripts/fuzz.sh [--build DIR] [--seconds N] [TARGET...]
# Each target first replays tests/fuzz/regressions/<target>/ (inputs that once crashed), then
# fuzzes for N seconds from its corpus (DIR/corpus/<target>, kept between runs so long runs add
# up) and the seeds written by chorus_fuzz_seeds. Exits non-zero when any target crashes, leaks,
# times out or runs out of memory; the input that did it is in DIR/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
bin="$build/tests/fuzz"
if [ ! -x "$bin/chorus_fuzz_seeds" ]; then
  echo "fuzz.sh: no fuzz build in $build: run 'make fuzz' (it builds with clang and -DCHORUS_FUZZ=ON)" >&2
  exit 2
fi
if [ ${#targets[@]} -eq 0 ]; then
  for t in "$bin"/fuzz_*; do targets+=("$(basename "$t")"); done
fi
rm -rf "$build/seeds"
"$bin/chorus_fuzz_seeds" "$build/seeds"
mkdir -p "$build/crashes" "$build/logs"
report="$build/fuzz-report.md"
{
  echo "| target | seconds | runs | runs/s | coverage (edges) | features | corpus |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
} > "$report"
failed=()
for t in "${targets[@]}"; do
  exe="$bin/$t"
  if [ ! -x "$exe" ]; then echo "fuzz.sh: no target $t in $bin" >&2; exit 2; fi
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  # Fixed limits: a reader that allocates what a header claims, or loops on a short input,
  # fails here as it would fail a node.
  flags=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1
         "-artifact_prefix=$build/crashes/$t-")
  regressions="tests/fuzz/regressions/$t"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    if ! "$exe" "${flags[@]}" "$regressions"/* > "$build/logs/$t-regressions.log" 2>&1; then
      echo "fuzz.sh: $t: a regression input crashes again (log: $build/logs/$t-regressions.log)" >&2
      failed+=("$t"); continue
    fi
  fi
  log="$build/logs/$t.log"
  if "$exe" "${flags[@]}" -max_total_time="$seconds" "$corpus" "$build/seeds/$t" > "$log" 2>&1; then
    status=ok
  else
    status=failed
    failed+=("$t")
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[A-Za-z]*\).*/\1/p' <<< "$done_line")
  rate=$(( ${runs:-0} / (seconds > 0 ? seconds : 1) ))
  echo "| $t | $seconds | ${runs:-?} | $rate | ${cov:-?} | ${ft:-?} | ${corp:-?} |" >> "$report"
  printf 'fuzz: %-16s %s  runs %s  coverage %s edges\n' "$t" "$status" "${runs:-?}" "${cov:-?}"
  if [ "$status" = failed ]; then
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5 | sed 's/^/  /' >&2
    echo "  log: $log; reproduce with: $exe <the crash file>" >&2
  fi
done
echo "fuzz: report in $report"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
