#include "ps/managed_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace chorus::ps {

TokenBucket::TokenBucket(double bytes_per_s, double burst_bytes, TimePoint start)
    : rate_(bytes_per_s), burst_(burst_bytes), tokens_(burst_bytes), last_(start) {
  if (!(bytes_per_s > 0) || !std::isfinite(bytes_per_s)) {
    throw std::invalid_argument(
        fmt::format("bandwidth budget: {} bytes/s; it must be positive", bytes_per_s));
  }
  if (!(burst_bytes > 0) || !std::isfinite(burst_bytes)) {
    throw std::invalid_argument(
        fmt::format("bandwidth budget: a burst of {} bytes; it must be positive", burst_bytes));
  }
}

void TokenBucket::refill(TimePoint now) {
  if (now <= last_) return;
  const double elapsed = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
  last_ = now;
}

void TokenBucket::chargeQueued(uint64_t bytes) {
  tokens_ -= static_cast<double>(bytes);
  charged_ += bytes;
  managed_ += bytes;
}

void TokenBucket::observeSent(uint64_t bytes_out_total) {
  if (bytes_out_total <= charged_) return;
  const uint64_t other = bytes_out_total - charged_;
  tokens_ -= static_cast<double>(other);
  charged_ = bytes_out_total;
  other_ += other;
}

std::chrono::nanoseconds TokenBucket::untilPositive() const {
  if (tokens_ > 0) return std::chrono::nanoseconds(0);
  // Just past zero: a balance of exactly 0 may not send.
  const double seconds = (1.0 - tokens_) / rate_;
  return std::chrono::nanoseconds(static_cast<int64_t>(std::ceil(seconds * 1e9)));
}

TokenBucket ownerBudget(double mbps, double burst_s, size_t message_bytes, size_t receivers,
                        TokenBucket::TimePoint now) {
  const double rate = mbps * 1e6 / 8;
  const double one_round = static_cast<double>(message_bytes) * static_cast<double>(receivers + 1);
  return TokenBucket(rate, std::max(rate * burst_s, one_round), now);
}

double relativeChange(std::span<const float> now, std::span<const float> before) {
  double sum = 0;
  const size_t n = std::min(now.size(), before.size());
  for (size_t i = 0; i < n; ++i) {
    const double delta = static_cast<double>(now[i]) - static_cast<double>(before[i]);
    if (delta == 0) continue;
    sum += before[i] == 0 ? std::abs(delta) : std::abs(delta / static_cast<double>(before[i]));
  }
  return sum;
}

ChangeTracker::ChangeTracker(std::vector<Key> keys, const Rows& now) : keys_(std::move(keys)) {
  for (Key key : keys_) {
    const std::span<const float> row = now(key);
    last_sent_[key].assign(row.begin(), row.end());
  }
}

std::vector<Key> ChangeTracker::ranked(const Rows& now) const {
  std::vector<std::pair<double, Key>> moved;
  for (Key key : keys_) {
    const double change = relativeChange(now(key), last_sent_.at(key));
    if (change > 0) moved.emplace_back(change, key);
  }
  std::sort(moved.begin(), moved.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<Key> out;
  out.reserve(moved.size());
  for (const auto& entry : moved)
    out.push_back(entry.second);
  return out;
}

size_t ChangeTracker::fits(std::span<const Key> ranked, size_t max_bytes) const {
  size_t count = 0;
  size_t bytes = 0;
  for (Key key : ranked) {
    const size_t row = last_sent_.at(key).size() * sizeof(float);
    if (count > 0 && bytes + row > max_bytes) break;
    ++count;
    bytes += row;
  }
  return count;
}

std::vector<Key> ChangeTracker::pick(const Rows& now, size_t max_bytes) const {
  std::vector<Key> moved = ranked(now);
  moved.resize(fits(moved, max_bytes));
  return moved;
}

void ChangeTracker::sent(Key key, std::span<const float> values) {
  auto it = last_sent_.find(key);
  if (it == last_sent_.end()) {
    throw std::invalid_argument(fmt::format("ChangeTracker: key {} is not tracked", key));
  }
  if (it->second.size() != values.size()) {
    throw std::invalid_argument(fmt::format("ChangeTracker: key {} has {} floats, not {}", key,
                                            it->second.size(), values.size()));
  }
  it->second.assign(values.begin(), values.end());
}

}  // namespace chorus::ps
