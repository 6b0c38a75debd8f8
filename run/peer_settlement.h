// The end of a distributed run, shared by both modes: every node tells the other members it
// finished (TrainingDone) and waits until each of them has finished too or left, so that no node
// leaves while a peer may still need it (a neighbor's models, an owner's keys).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <vector>

namespace spdlog {
class logger;
}

namespace chorus::run {

// Who of the other members finished, left first, or neither when the wait ended.
struct PeerSettlement {
  std::vector<uint32_t> finished;
  std::vector<uint32_t> departed;
  std::vector<uint32_t> unsettled;
};

struct SettleOptions {
  std::chrono::milliseconds timeout{120000};
  std::chrono::milliseconds report_every{5000};
  // Checked with the lock held at every wake-up: the caller has work to do while it waits (for
  // example a late request to answer); `work` then runs with the lock released.
  std::function<bool()> has_work;
  std::function<void()> work;
};

// Waits on `changed`, with `lock` held on the mutex that guards `done`, `down` and `stopped`,
// until each of `others` is in `done` or `down`, `stopped` is true, or the time-out passes; logs
// the members still missing every report_every, and those that never settled at the end.
PeerSettlement settlePeers(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                           const std::vector<uint32_t>& others, const std::set<uint32_t>& done,
                           const std::set<uint32_t>& down, const bool& stopped,
                           const SettleOptions& options, spdlog::logger& log);

}  // namespace chorus::run
