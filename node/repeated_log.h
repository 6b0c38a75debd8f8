// One log line for a run of like events: the first is logged as it comes, the repeats are
// counted and summarized at most once per interval, and the rest when the run ends. A failure
// that recurs every clock (a push to an owner that is gone) is then a few lines, not thousands.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

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

}  // namespace chorus::node
