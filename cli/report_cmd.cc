// `chorus report DIR`: rebuilds summary.csv, report.md and the plots of a compare folder, or of
// the --out folder of one `chorus launch`. The work lives in chorus_report (report/report.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "report/conclusion.h"
#include "report/report.h"

namespace chorus::cli {
namespace {

struct ReportArgs {
  std::string folder;
  std::string gnuplot = "gnuplot";
};

void runReport(const ReportArgs& args) {
  report::ReportInput input;
  try {
    input = report::loadReportInput(args.folder);
  } catch (const report::ReportError& e) {
    throw CommandFailure(2, e.what());
  }
  report::Report built = report::buildReport(std::move(input));
  for (const auto& warning : built.warnings) {
    std::fprintf(stderr, "chorus: warning: %s\n", warning.c_str());
  }
  report::PlotSet plots;
  try {
    plots = report::writeReportFiles(built, args.folder, args.gnuplot);
  } catch (const report::ReportError& e) {
    throw CommandFailure(1, e.what());
  }
  fmt::print("{}\n", report::markdownTable(built));
  if (const std::string said = report::conclusion(built); !said.empty()) fmt::print("{}\n\n", said);
  fmt::print("table: {}/report.md, per run: {}/summary.csv\n", args.folder, args.folder);
  for (const auto& png : plots.pngs)
    fmt::print("plot: {}\n", png.string());
  for (const auto& why : plots.skipped)
    fmt::print("not drawn: {}\n", why);
  std::fflush(stdout);
}

}  // namespace

void addReportCommand(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Rebuild the results table (report.md, summary.csv) and the plots (plots/*.png, drawn by\n"
      "gnuplot) of a `chorus compare --out` folder, or of the --out folder of one\n"
      "`chorus launch` run, and print the table and, with a target, which variant reached it\n"
      "first and why. See docs/compare.md.");
  cmd->add_option("folder", args->folder, "The folder to report on")->required();
  cmd->add_option("--gnuplot", args->gnuplot, "The gnuplot executable")->capture_default_str();
  cmd->callback([args] { runReport(*args); });
}

}  // namespace chorus::cli
