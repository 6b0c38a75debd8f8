// How the report's tables write numbers: shared by the image models' table (report.cc) and the
// sparse models' one (sparse_table.cc), so that both read alike.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace chorus::report {

// "84.0%" from 0.84 with `decimals` decimals.
inline std::string percent(double fraction, int decimals) {
  return fmt::format("{:.{}f}%", 100 * fraction, decimals);
}

// Seconds and rates: two decimals below 10, one above, so small numbers keep their digits.
inline std::string shortNumber(double value) {
  return std::fabs(value) < 10 ? fmt::format("{:.2f}", value) : fmt::format("{:.1f}", value);
}

// "0", "12.3 kB", "4.5 MB", "1.23 GB".
inline std::string bytesText(double bytes) {
  if (bytes <= 0) return "0";
  if (bytes < 1e6) return fmt::format("{:.1f} kB", bytes / 1e3);
  if (bytes < 1e9) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

}  // namespace chorus::report
