#include "ps/sparse_managed.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace chorus::ps {

SparseRowPusher::SparseRowPusher(std::vector<Key> keys, const ChangeTracker::Rows& now)
    : tracker_(std::move(keys), now) {}

bool SparseRowPusher::pass(Clock min_clock, const ChangeTracker::Rows& now, size_t message_bytes,
                           const std::function<bool()>& can_send, const SendFrame& send) {
  const std::vector<Key> ranked = tracker_.ranked(now);
  // 1. The workers stop trusting what changed before any frame vouches for the rest: the
  // announcement goes first, or nothing goes.
  RowFrame announcement;
  for (Key key : ranked) {
    if (announced_.count(key) == 0) announcement.keys.push_back(key);
  }
  if (!announcement.keys.empty()) {
    if (!can_send()) return false;
    std::sort(announcement.keys.begin(), announcement.keys.end());
    send(announcement);
    announced_.insert(announcement.keys.begin(), announcement.keys.end());
  }
  // 2. The values, most changed first. Every frame vouches for the owner's rows at min_clock:
  // all that changed is announced, so what the worker was not told about is current.
  std::span<const Key> rest(ranked);
  while (!rest.empty()) {
    if (!can_send()) return false;
    const size_t count = tracker_.fits(rest, message_bytes);
    RowFrame frame;
    frame.min_clock = min_clock;
    frame.keys.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(count));
    std::sort(frame.keys.begin(), frame.keys.end());
    for (Key key : frame.keys) {
      const std::span<const float> row = now(key);
      frame.values.insert(frame.values.end(), row.begin(), row.end());
    }
    send(frame);
    for (Key key : frame.keys) {
      tracker_.sent(key, now(key));
      announced_.erase(key);
    }
    stamped_ = std::max(stamped_, min_clock);
    rest = rest.subspan(count);
  }
  // 3. Nothing changed, but the clock moved: vouch for the rows at the new stamp.
  if (min_clock > stamped_) {
    if (!can_send()) return false;
    RowFrame frame;
    frame.min_clock = min_clock;
    send(frame);
    stamped_ = min_clock;
  }
  return true;
}

ManagedRowCache::ManagedRowCache(const KeySpace& space, OwnerOf owner, std::vector<float> model,
                                 Staleness staleness)
    : space_(space),
      owner_(std::move(owner)),
      values_(std::move(model)),
      frozen_(space.keyEnd(), kNotFrozen),
      fresh_(staleness) {
  if (values_.size() != space_.total()) {
    throw std::invalid_argument(
        fmt::format("managed rows: a model of {} floats for a key space of {}", values_.size(),
                    space_.total()));
  }
}

std::optional<std::string> ManagedRowCache::offer(NodeId from, Clock min_clock,
                                                  std::span<const Key> keys,
                                                  std::span<const float> values) {
  if (min_clock < RowFrame::kAnnouncement) {
    return fmt::format("a stamp of {} (a clock, or -1 for an announcement)", min_clock);
  }
  if (std::optional<std::string> error = space_.check(keys, std::nullopt)) return error;
  size_t floats = 0;
  for (Key key : keys) {
    if (owner_(key) != from) {
      return fmt::format("key {} is node {}'s, not the sender's", key, owner_(key));
    }
    floats += space_.length(key);
  }
  if (min_clock == RowFrame::kAnnouncement) {
    if (!values.empty()) return fmt::format("an announcement with {} floats", values.size());
    // The rows changed after the owner's last frame, with updates from clocks >= its stamp
    // (an update applied while the owner's minimum clock was m comes from a clock >= m): the
    // copies still hold every update from clocks below that stamp, and no later one is vouched
    // for until their values come.
    const Clock stamp = stampOf(from);
    for (Key key : keys) {
      if (frozen_[key] == kNotFrozen) frozen_[key] = stamp;
    }
    return std::nullopt;
  }
  if (values.size() != floats) {
    return fmt::format("{} floats for {} keys of {} floats", values.size(), keys.size(), floats);
  }
  for (float v : values) {
    if (!std::isfinite(v)) return std::string("a value that is not finite");
  }
  size_t at = 0;
  for (Key key : keys) {
    const size_t n = space_.length(key);
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), n,
                values_.begin() + static_cast<std::ptrdiff_t>(space_.offset(key)));
    frozen_[key] = kNotFrozen;
    at += n;
  }
  Clock& stamp = stamps_[from];
  stamp = std::max(stamp, min_clock);
  return std::nullopt;
}

size_t ManagedRowCache::read(std::span<const Key> keys, Clock clock, std::span<float> out,
                             std::vector<size_t>& missing) const {
  size_t served = 0;
  size_t at = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const Key key = keys[i];
    const size_t n = space_.length(key);
    const Clock stamp = frozen_[key] != kNotFrozen ? frozen_[key] : stampOf(owner_(key));
    if (fresh_.fresh(stamp, clock)) {
      std::copy_n(values_.begin() + static_cast<std::ptrdiff_t>(space_.offset(key)), n,
                  out.begin() + static_cast<std::ptrdiff_t>(at));
      ++served;
    } else {
      missing.push_back(i);
    }
    at += n;
  }
  return served;
}

Clock ManagedRowCache::stampOf(NodeId owner) const {
  auto it = stamps_.find(owner);
  return it == stamps_.end() ? 0 : it->second;
}

}  // namespace chorus::ps
