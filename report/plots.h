// The plots of a report, drawn by gnuplot (pngcairo) from scripts written next to them, and the
// look of each variant in them. docs/compare.md "Plots" describes what each one shows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::report {

struct Report;

// The plots written.
struct PlotSet {
  std::vector<std::filesystem::path> pngs;  // written
  std::vector<std::string> skipped;         // plots not drawn and why
};

// How a variant is drawn: the same in every plot of every report, so that a variant keeps its
// color from one report to the next whatever else was compared with it.
struct VariantStyle {
  uint32_t rgb = 0;    // 0xRRGGBB
  int point_type = 7;  // gnuplot `pt`
};

// The style of a variant, from its name alone: a fixed one for single, ps:bsp, ps:ssp:N,
// ps:async and consensus:RULE (N, B, Q pick a shade within the family), a hash of the name into
// the palette for any other name.
VariantStyle variantStyle(std::string_view variant);

// The backups plot's moving average: rounds per window.
inline constexpr int kBackupsWindow = 25;

// The centered moving average of `values` over `window` consecutive entries (window / 2 on
// each side, fewer at the ends, where the window is cut at the series' edge).
std::vector<double> movingAverage(const std::vector<double>& values, int window);

// Writes FOLDER/plots/*.gp and runs `gnuplot` on each: accuracy-vs-time.png (with the runs'
// crashes, rejoins and drops marked), time-to-target.png (only when the compare had a target)
// and (with consensus runs) backups-per-round.png. Throws ReportError when gnuplot is missing or
// fails (naming the script and gnuplot's first error line).
PlotSet writePlots(const Report& report, const std::filesystem::path& folder,
                   const std::string& gnuplot = "gnuplot");

}  // namespace chorus::report
