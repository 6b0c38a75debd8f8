// The metrics reader of `chorus report` on untrusted files: a run folder whose node files were
// cut short by a crash, damaged, or written by something else. The input holds up to three node
// files separated by a line "~~~". A ReportError (no usable folder) is the documented answer;
// a bad line is a warning, and summarizing what was read never fails.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_support.h"
#include "report/json_line.h"
#include "report/run_metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  auto text = chorus::fuzz::asText(data, size);
  // The line parser on its own, on the first line.
  try {
    (void)chorus::report::JsonObject::parse(text.substr(0, text.find('\n')));
  } catch (const chorus::report::JsonError&) {
  }
  auto parts = chorus::fuzz::splitParts<3>(text, "\n~~~\n");
  const fs::path dir = chorus::fuzz::scratchDir() / "run";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i == 0 || !parts[i].empty()) {
      chorus::fuzz::writeFile(dir / ("node-" + std::to_string(i) + ".jsonl"), parts[i]);
    }
  }
  try {
    auto metrics = chorus::report::readRunFolder(dir);
    (void)chorus::report::summarizeRun(metrics);
    (void)chorus::report::variantNameOf(metrics);
  } catch (const chorus::report::ReportError&) {
  }
  return 0;
}
