#include "node/repeated_log.h"

#include <utility>

namespace chorus::node {

RepeatedLog::RepeatedLog(spdlog::logger& log, spdlog::level::level_enum level, std::string what,
                         Clock::duration interval, std::function<Clock::time_point()> now)
    : log_(log), level_(level), what_(std::move(what)), interval_(interval), now_(std::move(now)) {}

RepeatedLog::~RepeatedLog() {
  flush();
}

void RepeatedLog::add(const std::string& detail) {
  std::lock_guard lock(mutex_);
  ++total_;
  const Clock::time_point now = now_();
  if (total_ == 1) {
    log_.log(level_, "{}: {} (repeats are counted and said every {} s)", what_, detail,
             std::chrono::duration_cast<std::chrono::seconds>(interval_).count());
    last_line_ = now;
    return;
  }
  ++unsaid_;
  last_detail_ = detail;
  if (now - last_line_ >= interval_) {
    summarizeLocked();
    last_line_ = now;
  }
}

void RepeatedLog::flush() {
  std::lock_guard lock(mutex_);
  summarizeLocked();
}

uint64_t RepeatedLog::total() const {
  std::lock_guard lock(mutex_);
  return total_;
}

void RepeatedLog::summarizeLocked() {
  if (unsaid_ == 0) return;
  log_.log(level_, "{}: {} more time(s) ({} in all), the last: {}", what_, unsaid_, total_,
           last_detail_);
  unsaid_ = 0;
}

}  // namespace chorus::node
