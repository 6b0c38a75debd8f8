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

// A finite decimal number and nothing else; *ok says whether `part` is one.
double number(std::string_view part, bool* ok) {
  double value = 0;
  auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
  *ok = !part.empty() && ec == std::errc() && end == part.data() + part.size() &&
        std::isfinite(value);
  return value;
}

std::chrono::microseconds milliseconds(std::string_view text, std::string_view part,
                                       std::string_view name) {
  bool ok = false;
  const double ms = number(part, &ok);
  if (!ok) fail(text, fmt::format("{} '{}' is not a number", name, part));
  if (ms < 0 || ms > kMaxLinkDelayMs) {
    fail(text, fmt::format("{} {} is outside 0..{}", name, part, kMaxLinkDelayMs));
  }
  return std::chrono::microseconds(std::llround(ms * 1000.0));
}

[[noreturn]] void failLoss(std::string_view text, std::string_view what) {
  throw std::invalid_argument(
      fmt::format("bad link loss '{}': {} (accepted: none | P | P,RTO_MS with P from 0 to {} and "
                  "RTO_MS above 0 and at most {}; e.g. 0.01 or 0.01,200)",
                  text, what, kMaxLinkLoss, kMaxLinkRtoMs));
}

}  // namespace

LinkLoss LinkLoss::parse(std::string_view text) {
  LinkLoss loss;
  loss.text = std::string(text);
  if (text.empty() || text == "none") return loss;
  const size_t comma = text.find(',');
  const std::string_view p = text.substr(0, comma);
  bool ok = false;
  loss.probability = number(p, &ok);
  if (!ok) failLoss(text, fmt::format("P '{}' is not a number", p));
  if (loss.probability < 0 || loss.probability > kMaxLinkLoss) {
    failLoss(text, fmt::format("P {} is outside 0..{}", p, kMaxLinkLoss));
  }
  if (comma != std::string_view::npos) {
    const std::string_view rto = text.substr(comma + 1);
    const double ms = number(rto, &ok);
    if (!ok) failLoss(text, fmt::format("RTO_MS '{}' is not a number", rto));
    if (ms <= 0 || ms > kMaxLinkRtoMs) {
      failLoss(text, fmt::format("RTO_MS {} is not above 0 and at most {}", rto, kMaxLinkRtoMs));
    }
    loss.rto = std::chrono::microseconds(std::llround(ms * 1000.0));
    if (loss.rto.count() == 0) failLoss(text, fmt::format("RTO_MS {} rounds to 0", rto));
  }
  return loss;
}

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
