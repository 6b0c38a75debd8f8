#include "faults/link_delay.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace chorus::faults {

using node::invalidInput;
using node::Result;
using node::Status;

namespace {

Status badDelay(std::string_view text, std::string_view what) {
  return invalidInput(
      fmt::format("bad link delay '{}': {} (accepted: none | MS | MS,JITTER_MS, each from 0 to "
                  "{} ms; e.g. 20 or 20,5)",
                  text, what, kMaxLinkDelayMs));
}

Status badLoss(std::string_view text, std::string_view what) {
  return invalidInput(
      fmt::format("bad link loss '{}': {} (accepted: none | P | P,RTO_MS with P from 0 to {} and "
                  "RTO_MS above 0 and at most {}; e.g. 0.01 or 0.01,200)",
                  text, what, kMaxLinkLoss, kMaxLinkRtoMs));
}

// A finite decimal number and nothing else; *ok says whether `part` is one.
double number(std::string_view part, bool* ok) {
  double value = 0;
  auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
  *ok = !part.empty() && ec == std::errc() && end == part.data() + part.size() &&
        std::isfinite(value);
  return value;
}

Result<std::chrono::microseconds> milliseconds(std::string_view text, std::string_view part,
                                               std::string_view name) {
  bool ok = false;
  const double ms = number(part, &ok);
  if (!ok) return badDelay(text, fmt::format("{} '{}' is not a number", name, part));
  if (ms < 0 || ms > kMaxLinkDelayMs) {
    return badDelay(text, fmt::format("{} {} is outside 0..{}", name, part, kMaxLinkDelayMs));
  }
  return std::chrono::microseconds(std::llround(ms * 1000.0));
}

}  // namespace

Result<LinkLoss> LinkLoss::read(std::string_view text) {
  LinkLoss loss;
  loss.text = std::string(text);
  if (text.empty() || text == "none") return loss;
  const size_t comma = text.find(',');
  const std::string_view p = text.substr(0, comma);
  bool ok = false;
  loss.probability = number(p, &ok);
  if (!ok) return badLoss(text, fmt::format("P '{}' is not a number", p));
  if (loss.probability < 0 || loss.probability > kMaxLinkLoss) {
    return badLoss(text, fmt::format("P {} is outside 0..{}", p, kMaxLinkLoss));
  }
  if (comma != std::string_view::npos) {
    const std::string_view rto = text.substr(comma + 1);
    const double ms = number(rto, &ok);
    if (!ok) return badLoss(text, fmt::format("RTO_MS '{}' is not a number", rto));
    if (ms <= 0 || ms > kMaxLinkRtoMs) {
      return badLoss(text,
                     fmt::format("RTO_MS {} is not above 0 and at most {}", rto, kMaxLinkRtoMs));
    }
    loss.rto = std::chrono::microseconds(std::llround(ms * 1000.0));
    if (loss.rto.count() == 0) return badLoss(text, fmt::format("RTO_MS {} rounds to 0", rto));
  }
  return loss;
}

Result<LinkLoss> LinkLoss::fromValues(double probability, std::chrono::microseconds rto,
                                      std::string text) {
  if (!(probability >= 0 && probability <= kMaxLinkLoss)) {
    return badLoss(text, fmt::format("P {} is outside 0..{}", probability, kMaxLinkLoss));
  }
  if (rto.count() <= 0 || rto > node::kMaxLinkRto) {
    return badLoss(text, fmt::format("RTO {} us is not above 0 and at most {} ms", rto.count(),
                                     kMaxLinkRtoMs));
  }
  LinkLoss loss;
  loss.probability = probability;
  loss.rto = rto;
  loss.text = std::move(text);
  return loss;
}

Result<LinkDelay> LinkDelay::read(std::string_view text) {
  LinkDelay link;
  link.text = std::string(text);
  if (text.empty() || text == "none") return link;
  const size_t comma = text.find(',');
  Result<std::chrono::microseconds> delay = milliseconds(text, text.substr(0, comma), "MS");
  if (!delay.ok()) return delay.status();
  link.delay = *delay;
  if (comma != std::string_view::npos) {
    Result<std::chrono::microseconds> jitter =
        milliseconds(text, text.substr(comma + 1), "JITTER_MS");
    if (!jitter.ok()) return jitter.status();
    link.jitter = *jitter;
  }
  return link;
}

Result<LinkDelay> LinkDelay::fromValues(std::chrono::microseconds delay,
                                        std::chrono::microseconds jitter, std::string text) {
  for (const auto& [name, value] : {std::pair{"delay", delay}, std::pair{"jitter", jitter}}) {
    if (value.count() < 0 || value > node::kMaxLinkDelay) {
      return badDelay(
          text, fmt::format("{} {} us is outside 0..{} ms", name, value.count(), kMaxLinkDelayMs));
    }
  }
  LinkDelay link;
  link.delay = delay;
  link.jitter = jitter;
  link.text = std::move(text);
  return link;
}

}  // namespace chorus::faults
