// A node-wide bound on inbound bytes in flight: the buffers FrameDecoders allocate for frames
// that are still being read (Envelope and attachment bytes the decoder owns). Every connection
// of a node reserves from one budget before it allocates, and a frame that does not fit is
// refused (docs/wire-format.md, "Limits"). Thread-safe (atomics): the loop thread reserves,
// a frame's reservation is released wherever the frame dies, stats() is read by anyone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace chorus::node {

// What a budget holds and held; any thread.
struct InboundStats {
  uint64_t budget_bytes = 0;    // the node-wide limit
  uint64_t reserved_bytes = 0;  // inbound buffers held now
  uint64_t peak_reserved_bytes = 0;
  uint64_t refused_frames = 0;        // frames refused because they did not fit the budget
  uint64_t oversized_handshakes = 0;  // frames over the pre-handshake limit (connection closed)
  uint64_t handshaking = 0;           // accepted connections still in their handshake
  uint64_t refused_connections = 0;   // closed at accept: too many still in their handshake
};

class InboundBudget {
 public:
  explicit InboundBudget(uint64_t budget_bytes) : budget_(budget_bytes) {}
  InboundBudget(const InboundBudget&) = delete;
  InboundBudget& operator=(const InboundBudget&) = delete;

  // Takes `bytes` when they fit under the budget; false (and nothing taken) otherwise.
  bool tryReserve(uint64_t bytes);
  // Gives back bytes taken by tryReserve.
  void release(uint64_t bytes) { reserved_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t budget() const { return budget_; }
  uint64_t reserved() const { return reserved_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  const uint64_t budget_;
  std::atomic<uint64_t> reserved_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> refused_{0};
};

// Bytes held from a budget, given back when this is destroyed (or reset). Move-only.
class BudgetReservation {
 public:
  BudgetReservation() = default;
  BudgetReservation(InboundBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  BudgetReservation(BudgetReservation&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  BudgetReservation& operator=(BudgetReservation&& other) noexcept {
    if (this != &other) {
      reset();
      budget_ = std::exchange(other.budget_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  BudgetReservation(const BudgetReservation&) = delete;
  BudgetReservation& operator=(const BudgetReservation&) = delete;
  ~BudgetReservation() { reset(); }

  void reset() {
    if (budget_ != nullptr && bytes_ > 0) budget_->release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  InboundBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

inline bool InboundBudget::tryReserve(uint64_t bytes) {
  uint64_t now = reserved_.load(std::memory_order_relaxed);
  do {
    if (bytes > budget_ || now > budget_ - bytes) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!reserved_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now + bytes > peak &&
         !peak_.compare_exchange_weak(peak, now + bytes, std::memory_order_relaxed)) {
  }
  return true;
}

}  // namespace chorus::node
