// How often to log a message refused from a peer: every refusal is counted, the first few of
// each peer are logged, then one in every `every`, so that a peer repeating a bad message
// cannot flood the log (docs/errors.md, "Values from peers"). Not thread-safe: one owner thread
// (the loop thread).
#pragma once

#include <cstdint>
#include <map>

#include "node/protocol.h"

namespace chorus::node {

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
  uint64_t total() const { return total_; }

 private:
  uint64_t first_;
  uint64_t every_;
  std::map<NodeId, uint64_t> counts_;
  uint64_t total_ = 0;
};

}  // namespace chorus::node
