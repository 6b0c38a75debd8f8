// Saying a repeated thing once, with a count, instead of every time. Two forms of one idea:
// - RepeatedLog, for a run of like events of one stream: the first is logged as it comes, the
//   repeats are counted and summarized at most once per interval, and the rest when the run
//   ends. A failure that recurs every clock (a push to an owner that is gone) is then a few
//   lines, not thousands.
// - RefusalLog, for messages refused from peers (docs/errors.md, "Values from peers"): every
//   refusal is counted per peer, the first few of each peer are logged, then one in every
//   `every` with the count so far, so that a peer repeating a bad message cannot flood the log.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "node/protocol.h"

namespace chorus::node {

class RepeatedLog {
 public:
  using Clock = std::chrono::steady_clock;
  // `what` names the event in the summary ("a push was lost"); `now` is injectable for tests.
  RepeatedLog(spdlog::logger& log, spdlog::level::level_enum level, std::string what,
              Clock::duration interval = std::chrono::seconds(10),
              std::function<Clock::time_point()> now = Clock::now);
  RepeatedLog(const RepeatedLog&) = delete;
  RepeatedLog& operator=(const RepeatedLog&) = delete;
  // Says the repeats not yet said.
  ~RepeatedLog();

  // Any thread: one occurrence, with what is particular to it (logged for the first one, and
  // for the last one of each summary).
  void add(const std::string& detail);
  // Logs the count of repeats not yet said, if any.
  void flush();
  // Occurrences so far.
  uint64_t total() const;

 private:
  void summarizeLocked();

  spdlog::logger& log_;
  spdlog::level::level_enum level_;
  std::string what_;
  Clock::duration interval_;
  std::function<Clock::time_point()> now_;
  mutable std::mutex mutex_;
  uint64_t total_ = 0;
  uint64_t unsaid_ = 0;  // repeats since the last line
  std::string last_detail_;
  Clock::time_point last_line_{};
};

// Not thread-safe: one owner thread (the loop thread). The caller logs the refusals count()
// picks, with countOf() in the line.
class RefusalLog {
 public:
  explicit RefusalLog(uint64_t first = 10, uint64_t every = 1000) : first_(first), every_(every) {}

  // Counts one refusal of `peer`'s; true when this one is to be logged.
  bool count(NodeId peer) {
    const uint64_t n = ++counts_[peer];
    ++total_;
    return n <= first_ || n % every_ == 0;
  }
  // Refusals of `peer`'s so far.
  uint64_t countOf(NodeId peer) const {
    auto it = counts_.find(peer);
    return it == counts_.end() ? 0 : it->second;
  }
  // Refusals of every peer so far.
  uint64_t total() const { return total_; }

 private:
  uint64_t first_;
  uint64_t every_;
  std::map<NodeId, uint64_t> counts_;
  uint64_t total_ = 0;
};

}  // namespace chorus::node
