#include "faults/link_delay.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace chorus::faults {
namespace {

[[noreturn]] void fail(std::string_view text, std::string_view what) {
  throw std::invalid_argument(
      fmt::format("bad link delay '{}': {} (accepted: none | MS | MS,JITTER_MS, each from 0 to "
                  "{} ms; e.g. 20 or 20,5)",
                  text, what, kMaxLinkDelayMs));
}

std::chrono::microseconds milliseconds(std::string_view text, std::string_view part,
                                       std::string_view name) {
  double ms = 0;
  auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), ms);
  if (part.empty() || ec != std::errc() || end != part.data() + part.size() || !std::isfinite(ms)) {
    fail(text, fmt::format("{} '{}' is not a number", name, part));
  }
  if (ms < 0 || ms > kMaxLinkDelayMs) {
    fail(text, fmt::format("{} {} is outside 0..{}", name, part, kMaxLinkDelayMs));
  }
  return std::chrono::microseconds(std::llround(ms * 1000.0));
}

}  // namespace

LinkDelay LinkDelay::parse(std::string_view text) {
  LinkDelay link;
  link.text = std::string(text);
  if (text.empty() || text == "none") return link;
  const size_t comma = text.find(',');
  link.delay = milliseconds(text, text.substr(0, comma), "MS");
  if (comma != std::string_view::npos) {
    link.jitter = milliseconds(text, text.substr(comma + 1), "JITTER_MS");
  }
  return link;
}

}  // namespace chorus::faults
