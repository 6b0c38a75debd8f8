#include "faults/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <thread>

#include "faults/crash.h"

namespace chorus::faults {

using node::invalidInput;
using node::Result;
using node::Status;

namespace {

// The largest values a term takes. Past these the delays overflowed the int64 nanoseconds they
// become (fixed:1e13, slow:0=1e300) and came out negative or zero.
constexpr double kMaxMs = 1e9;        // MS, BASE_MS, MEAN_MS: 11.6 days per step
constexpr double kMaxSteps = 1e12;    // transient STEPS
constexpr double kMaxFactor = 1e6;    // slow and transient FACTOR
constexpr double kMaxDelayMs = 1e12;  // one step's delay (terms combined): 31 years

// crash STEP, the same cap as transient STEPS: a larger one is a typo, not an experiment.
constexpr int64_t kMaxCrashStep = 1'000'000'000'000;

constexpr std::string_view kForms =
    "accepted terms, joined with '+': none | fixed:MS | shifted-exp:BASE_MS,MEAN_MS | "
    "slow:NODE=FACTOR[,NODE=FACTOR...] | transient:PROB,STEPS,FACTOR | "
    "crash:NODE@STEP[,NODE@STEP...]";

Status bad(std::string_view term, std::string_view what) {
  return invalidInput(fmt::format("bad straggler term '{}': {} ({})", term, what, kForms));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(trim(s.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  return parts;
}

Result<double> number(std::string_view term, std::string_view text, std::string_view name) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
    return bad(term, fmt::format("{} '{}' is not a number", name, text));
  }
  return v;
}

Result<uint32_t> nodeId(std::string_view term, std::string_view text) {
  uint32_t id = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return bad(term, fmt::format("node id '{}' is not a non-negative integer", text));
  }
  return id;
}

Result<std::vector<double>> numbers(std::string_view term, std::string_view args,
                                    std::initializer_list<std::string_view> names) {
  auto parts = split(args, ',');
  if (parts.size() != names.size()) {
    return bad(term, fmt::format("expected {} number(s) separated by ','", names.size()));
  }
  std::vector<double> out;
  size_t i = 0;
  for (auto name : names) {
    Result<double> v = number(term, parts[i++], name);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

// The ranges of a term's numbers, checked on every term however it was made (parsed from the
// grammar, or read from a run spec's fields): `term` names it in the message.
Status checkRanges(const StragglerTerm& t, std::string_view term) {
  switch (t.kind) {
    case StragglerTerm::Kind::kFixed:
      if (!(t.a >= 0 && t.a <= kMaxMs)) return bad(term, "MS must be >= 0 and at most 1000000000");
      break;
    case StragglerTerm::Kind::kShiftedExp:
      if (!(t.a >= 0 && t.a <= kMaxMs && t.b >= 0 && t.b <= kMaxMs)) {
        return bad(term, "BASE_MS and MEAN_MS must be >= 0 and at most 1000000000");
      }
      break;
    case StragglerTerm::Kind::kSlow:
      if (t.factors.empty()) return bad(term, "slow names no node");
      for (const auto& [id, factor] : t.factors) {
        if (!(factor >= 1 && factor <= kMaxFactor)) {
          return bad(
              term,
              fmt::format("FACTOR {} must be >= 1 (1 = normal speed) and at most 1000000", factor));
        }
      }
      break;
    case StragglerTerm::Kind::kTransient:
      if (!(t.a >= 0 && t.a <= 1)) return bad(term, "PROB must be within [0, 1]");
      if (!(t.b >= 1 && t.b <= kMaxSteps) || std::floor(t.b) != t.b) {
        return bad(term, "STEPS must be a whole number >= 1 and at most 1000000000000");
      }
      if (!(t.c >= 1 && t.c <= kMaxFactor)) {
        return bad(term, "FACTOR must be >= 1 and at most 1000000");
      }
      break;
    case StragglerTerm::Kind::kCrash:
      if (t.crash_steps.empty()) return bad(term, "crash names no node");
      for (const auto& [id, step] : t.crash_steps) {
        if (step < 1 || step > kMaxCrashStep) {
          return bad(term, fmt::format("STEP '{}' must be a whole number from 1 (the node's first "
                                       "step) to 1000000000000",
                                       step));
        }
      }
      break;
    default:
      return bad(term, fmt::format("unknown kind {}", static_cast<int>(t.kind)));
  }
  return Status();
}

Result<StragglerTerm> parseTerm(std::string_view term) {
  size_t colon = term.find(':');
  if (colon == std::string_view::npos) return bad(term, "missing ':' after the term's name");
  std::string_view name = term.substr(0, colon);
  std::string_view args = term.substr(colon + 1);
  StragglerTerm t;
  if (name == "fixed" || name == "shifted-exp" || name == "transient") {
    t.kind = name == "fixed"         ? StragglerTerm::Kind::kFixed
             : name == "shifted-exp" ? StragglerTerm::Kind::kShiftedExp
                                     : StragglerTerm::Kind::kTransient;
    const auto v = name == "fixed"         ? numbers(term, args, {"MS"})
                   : name == "shifted-exp" ? numbers(term, args, {"BASE_MS", "MEAN_MS"})
                                           : numbers(term, args, {"PROB", "STEPS", "FACTOR"});
    if (!v.ok()) return v.status();
    t.a = (*v)[0];
    if (v->size() > 1) t.b = (*v)[1];
    if (v->size() > 2) t.c = (*v)[2];
  } else if (name == "slow") {
    t.kind = StragglerTerm::Kind::kSlow;
    for (std::string_view pair : split(args, ',')) {
      size_t eq = pair.find('=');
      if (eq == std::string_view::npos)
        return bad(term, fmt::format("'{}' is not NODE=FACTOR", pair));
      const Result<uint32_t> id = nodeId(term, trim(pair.substr(0, eq)));
      if (!id.ok()) return id.status();
      const Result<double> factor = number(term, trim(pair.substr(eq + 1)), "FACTOR");
      if (!factor.ok()) return factor.status();
      if (!(*factor >= 1 && *factor <= kMaxFactor)) {
        return bad(
            term,
            fmt::format("FACTOR {} must be >= 1 (1 = normal speed) and at most 1000000", *factor));
      }
      if (!t.factors.emplace(*id, *factor).second) {
        return bad(term, fmt::format("node {} is listed twice", *id));
      }
    }
  } else if (name == "crash") {
    t.kind = StragglerTerm::Kind::kCrash;
    for (std::string_view pair : split(args, ',')) {
      size_t at = pair.find('@');
      if (at == std::string_view::npos)
        return bad(term, fmt::format("'{}' is not NODE@STEP", pair));
      const Result<uint32_t> id = nodeId(term, trim(pair.substr(0, at)));
      if (!id.ok()) return id.status();
      const std::string_view step_text = trim(pair.substr(at + 1));
      int64_t step = 0;
      auto [end, ec] = std::from_chars(step_text.data(), step_text.data() + step_text.size(), step);
      if (step_text.empty() || ec != std::errc() || end != step_text.data() + step_text.size() ||
          step < 1 || step > kMaxCrashStep) {
        return bad(term, fmt::format("STEP '{}' must be a whole number from 1 (the node's first "
                                     "step) to 1000000000000",
                                     step_text));
      }
      if (!t.crash_steps.emplace(*id, step).second) {
        return bad(term, fmt::format("node {} is listed twice", *id));
      }
    }
  } else {
    return bad(term, fmt::format("unknown kind '{}'", name));
  }
  if (Status ranges = checkRanges(t, term); !ranges.ok()) return ranges;
  return t;
}

// A process crashes once: two crash steps for one node are a mistake, whichever terms (or
// sources: command line and topology file) they come from.
Status checkOneCrashPerNode(const StragglerProfile& profile) {
  std::map<uint32_t, int64_t> seen;
  for (const auto& t : profile.terms) {
    for (const auto& [id, step] : t.crash_steps) {
      auto [it, inserted] = seen.emplace(id, step);
      if (!inserted) {
        return bad(profile.text, fmt::format("node {} is given two crash steps ({} and {}); a "
                                             "node crashes once",
                                             id, it->second, step));
      }
    }
  }
  return Status();
}

}  // namespace

Result<StragglerProfile> StragglerProfile::read(std::string_view text) {
  StragglerProfile profile;
  profile.text = std::string(trim(text));
  if (profile.text.empty() || profile.text == "none") return profile;
  for (std::string_view term : split(profile.text, '+')) {
    if (term.empty()) return bad(profile.text, "empty term (two '+' in a row, or a trailing '+')");
    if (term == "none") continue;
    Result<StragglerTerm> parsed = parseTerm(term);
    if (!parsed.ok()) return parsed.status();
    profile.terms.push_back(std::move(parsed).value());
  }
  if (Status once = checkOneCrashPerNode(profile); !once.ok()) return once;
  return profile;
}

Result<StragglerProfile> StragglerProfile::fromTerms(std::vector<StragglerTerm> terms,
                                                     std::string text) {
  StragglerProfile profile;
  profile.terms = std::move(terms);
  profile.text = std::move(text);
  for (const StragglerTerm& t : profile.terms) {
    if (Status ranges = checkRanges(t, profile.text); !ranges.ok()) return ranges;
  }
  if (Status once = checkOneCrashPerNode(profile); !once.ok()) return once;
  return profile;
}

Result<StragglerProfile> StragglerProfile::combinedWith(const StragglerProfile& other) const {
  StragglerProfile out = *this;
  out.terms.insert(out.terms.end(), other.terms.begin(), other.terms.end());
  if (out.text.empty() || out.text == "none") {
    out.text = other.text;
  } else if (!other.text.empty() && other.text != "none") {
    out.text += "+" + other.text;
  }
  if (Status once = checkOneCrashPerNode(out); !once.ok()) return once;
  return out;
}

std::vector<uint32_t> StragglerProfile::namedNodes() const {
  std::set<uint32_t> named;
  for (const auto& t : terms) {
    for (const auto& [id, factor] : t.factors)
      named.insert(id);
    for (const auto& [id, step] : t.crash_steps)
      named.insert(id);
  }
  return {named.begin(), named.end()};
}

namespace {
// A term in the grammar parse() reads; numbers in their shortest exact form.
std::string termText(const StragglerTerm& t) {
  switch (t.kind) {
    case StragglerTerm::Kind::kFixed:
      return fmt::format("fixed:{}", t.a);
    case StragglerTerm::Kind::kShiftedExp:
      return fmt::format("shifted-exp:{},{}", t.a, t.b);
    case StragglerTerm::Kind::kTransient:
      return fmt::format("transient:{},{},{}", t.a, t.b, t.c);
    case StragglerTerm::Kind::kSlow: {
      std::vector<std::string> pairs;
      for (const auto& [id, factor] : t.factors)
        pairs.push_back(fmt::format("{}={}", id, factor));
      return fmt::format("slow:{}", fmt::join(pairs, ","));
    }
    case StragglerTerm::Kind::kCrash: {
      std::vector<std::string> pairs;
      for (const auto& [id, step] : t.crash_steps)
        pairs.push_back(fmt::format("{}@{}", id, step));
      return fmt::format("crash:{}", fmt::join(pairs, ","));
    }
  }
  return "none";
}
}  // namespace

StragglerProfile StragglerProfile::restrictedTo(uint32_t id) const {
  StragglerProfile out;
  std::vector<std::string> texts;
  for (const auto& t : terms) {
    StragglerTerm kept = t;
    if (t.kind == StragglerTerm::Kind::kSlow || t.kind == StragglerTerm::Kind::kCrash) {
      std::erase_if(kept.factors, [id](const auto& entry) { return entry.first != id; });
      std::erase_if(kept.crash_steps, [id](const auto& entry) { return entry.first != id; });
      if (kept.factors.empty() && kept.crash_steps.empty()) continue;
    }
    texts.push_back(termText(kept));
    out.terms.push_back(std::move(kept));
  }
  out.text = texts.empty() ? "none" : fmt::format("{}", fmt::join(texts, "+"));
  return out;
}

StragglerInjector::StragglerInjector(StragglerProfile profile, uint32_t node_id, uint64_t seed)
    : profile_(std::move(profile)), node_id_(node_id), transient_left_(profile_.terms.size(), 0) {
  // Each node draws from its own stream, fixed by (seed, node id) alone.
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), node_id,
                    0x5354524du};
  rng_.seed(seq);
  for (const auto& t : profile_.terms) {
    if (auto it = t.crash_steps.find(node_id_); it != t.crash_steps.end()) {
      crash_step_ = crash_step_ == 0 ? it->second : std::min(crash_step_, it->second);
    }
  }
}

bool StragglerInjector::inert() const {
  for (const auto& t : profile_.terms) {
    switch (t.kind) {
      case StragglerTerm::Kind::kFixed:
        if (t.a > 0) return false;
        break;
      case StragglerTerm::Kind::kShiftedExp:
        if (t.a > 0 || t.b > 0) return false;
        break;
      case StragglerTerm::Kind::kSlow: {
        auto it = t.factors.find(node_id_);
        if (it != t.factors.end() && it->second > 1) return false;
        break;
      }
      case StragglerTerm::Kind::kTransient:
        if (t.a > 0 && t.c > 1) return false;
        break;
      case StragglerTerm::Kind::kCrash:
        if (t.crash_steps.contains(node_id_)) return false;
        break;
    }
  }
  return true;
}

std::chrono::nanoseconds StragglerInjector::nextDelay(std::chrono::nanoseconds compute) {
  ++steps_;
  double ms = 0;
  double slow_factor = 1;
  const double compute_ms = std::chrono::duration<double, std::milli>(compute).count();
  for (size_t i = 0; i < profile_.terms.size(); ++i) {
    const StragglerTerm& t = profile_.terms[i];
    switch (t.kind) {
      case StragglerTerm::Kind::kFixed:
        ms += t.a;
        break;
      case StragglerTerm::Kind::kShiftedExp:
        ms += t.a;
        // Draw even when the mean is 0 so that a profile's random stream does not depend on
        // the values of earlier terms.
        if (t.b > 0) {
          ms += std::exponential_distribution<double>(1.0 / t.b)(rng_);
        } else {
          rng_();
        }
        break;
      case StragglerTerm::Kind::kSlow: {
        // Applied after every other term, below: a slow node is slow at the whole step.
        auto it = t.factors.find(node_id_);
        if (it != t.factors.end()) slow_factor *= it->second;
        break;
      }
      case StragglerTerm::Kind::kTransient: {
        double u = std::uniform_real_distribution<double>(0, 1)(rng_);
        int64_t& left = transient_left_[i];
        if (left == 0 && u < t.a) left = static_cast<int64_t>(t.b);
        if (left > 0) {
          ms += (t.c - 1) * compute_ms;
          --left;
        }
        break;
      }
      case StragglerTerm::Kind::kCrash:
        break;  // draws nothing: adding a crash leaves every delay of the run as it was
    }
  }
  // A node F times slower takes F times as long for the whole step: its compute and every
  // delay the other terms drew for it.
  ms += (slow_factor - 1) * (compute_ms + ms);
  // Terms within their limits can still add or multiply past what int64 nanoseconds hold.
  ms = std::clamp(ms, 0.0, kMaxDelayMs);
  auto delay = std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6));
  total_ = delay <= std::chrono::nanoseconds::max() - total_ ? total_ + delay
                                                             : std::chrono::nanoseconds::max();
  return delay;
}

std::chrono::nanoseconds StragglerInjector::waitAfterStep(std::chrono::nanoseconds compute) {
  auto delay = nextDelay(compute);
  // Real waiting, on purpose: the straggler must cost wall-clock time like a slow machine does.
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  // The crash is taken here, the one call both modes make right after every step, so that
  // neither mode (nor a future one) can forget it; nextDelay() and crashDue() stay free of
  // process policy, for tests and for anything that runs nodes as threads.
  if (crashDue()) crashProcess(node_id_, steps_);
  return delay;
}

}  // namespace chorus::faults
