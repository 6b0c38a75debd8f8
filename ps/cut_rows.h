// The rows of a PS owner in a whole-cluster checkpoint (docs/checkpoints.md): what a cut holds of
// a KeyStore (keys, values, optimizer state, update counts) and how a resumed owner takes them
// back. Shared by dense PS (ps/ps_peer.cc) and sparse PS (ps/sparse_ps_peer.cc), which differ in
// when they take the rows, not in what they write. No networking.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/key_store.h"
#include "run/cut_plan.h"

namespace chorus::ps {

// Rows of a store, in key order: `values` and `state` are the rows' floats one after another.
struct CutRows {
  std::vector<uint64_t> keys;
  std::vector<uint64_t> updates;
  std::vector<float> values;
  std::vector<float> state;
};

// Copies the rows of `keys` (sorted, every one held by `store`) out of `store`. Throws
// std::logic_error for a key the store does not hold (the caller's contract).
CutRows copyCutRows(const KeyStore& store, std::span<const Key> keys);
// Adds `rows` to `part` as its arrays "keys", "updates", "values" and "state".
void putCutRows(CutRows rows, run::NodeCheckpoint& part);
// Sets the rows of `store` from `cut`'s arrays (written by putCutRows; read from `path`): the keys
// must be exactly the store's, every value finite. Throws run::NodeCheckpointError naming `path`,
// what is wrong and `remedy` (the flags to resume with).
void restoreCutRows(KeyStore& store, const run::NodeCheckpoint& cut, const std::string& path,
                    const std::string& remedy);

}  // namespace chorus::ps
