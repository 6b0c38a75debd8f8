// The seam between sparse PS mode's training loop (ps/sparse_ps_peer.h) and the technique that
// manages its rows (issue 25; docs/sparse-ps.md, "Techniques"). The loop only ever asks
// "pull these rows", "push these gradients", "localize these keys" and "end the clock"; each
// technique answers them its own way:
// - ClassicRowAccess: every row at its home (ShardMap) for the whole run, read and written through
//   KvWorker and KvServer; localize does nothing.
// - LapseRowAccess: rows move to the node that localizes them (ps/relocation_shell.h, Lapse).
// A further technique (NuPS replication beside relocation) implements SparseRowAccess too and is
// chosen in makeSparseRowAccess(); the loop does not change. The sampling primitives
// (ps/sample_worker.h) use the same seam: pull for the sampled rows' values, localize for the
// keys a scheme wants here ahead of use, isLocal as the schemes' "is this key local now?".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/status.h"
#include "ps/key_localizer.h"
#include "ps/key_store.h"
#include "ps/ps_run_barrier.h"
#include "ps/ssp.h"

namespace chorus::node {
class Node;
}

// The classic path (KvServer, KvWorker) and the lapse path (RelocationShell) are built in
// separate files, sparse_row_access_classic.cc and sparse_row_access_lapse.cc: the two protocols'
// message structs share names (PullAnswer) in this namespace and never meet in one file.
namespace chorus::ps {

class KvServer;
class KvWorker;
struct PsOptions;

// --technique: how the rows of a sparse PS run are managed.
enum class SparseTechnique : uint8_t {
  kClassic,  // every row at its hash owner
  kLapse,    // relocation: rows move to where they are used (Lapse)
};
// "classic" or "lapse".
const char* sparseTechniqueName(SparseTechnique technique);
// Parses --technique's value; nullopt for an unknown name.
std::optional<SparseTechnique> parseSparseTechnique(const std::string& name);

// Counters of a data path since it started; any thread.
struct RowAccessStats {
  uint64_t keys_local = 0;   // row reads and writes served by rows held here
  uint64_t keys_remote = 0;  // ... sent to other nodes
  uint64_t localized = 0;    // keys asked to localize
  uint64_t localize_failed = 0;
  uint64_t held_keys = 0;  // rows held here now (classic: its home rows)
};

// Also the sampling primitives' KeyLocalizer (its localize) and locality oracle (isLocal).
class SparseRowAccess : public KeyLocalizer {
 public:
  using Handle = uint64_t;
  virtual ~SparseRowAccess() = default;
  // Trainer thread. Keys sorted, unique and in the key space; buffers their floats and valid
  // until the operation completed.
  // Reads `keys` into `out` under SSP at the worker's clock.
  virtual Handle pull(std::span<const Key> keys, std::span<float> out) = 0;
  // Reads `keys` once every live worker reached `min_clock` (the end-of-run read).
  virtual Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) = 0;
  // Pushes the gradients of `keys` (copied), made at the worker's clock; the row's owner applies
  // the optimizer with the row's state.
  virtual Handle push(std::span<const Key> keys, std::span<const float> grads) = 0;
  // Blocks until the operation completed; its status.
  virtual node::Status wait(Handle handle) = 0;
  // Any thread: the worker will use `keys` soon; the technique may move them here. `done` runs
  // once (ok or why not; a failure is harmless: the keys are read where they are).
  void localize(std::span<const Key> keys, KeyLocalizer::Done done) override = 0;
  // Any thread, cheap (no lock, no message): would a read of `key` issued now be served here,
  // without a frame (the row is held here: owned, or replicated)? The sampling schemes' locality
  // oracle (onlylocal draws only such keys, preloc and pool localize the others;
  // ps/sample_worker.h). A snapshot: a moving row may arrive or leave right after. A technique that
  // does not override it says "no" for every key: the conforming schemes stay exact (they read
  // every sampled key through pull), onlylocal then refuses to sample.
  virtual bool isLocal(Key /*key*/) const { return false; }
  // Ends the worker's clock (SSP).
  virtual void clock() = 0;
  // Any thread: every pending and later operation fails with `status`.
  virtual void cancelAll(const node::Status& status) = 0;
  virtual RowAccessStats stats() const = 0;
  // What the end-of-run barrier tells the data path (peer events, TrainingDone, ticks).
  virtual PsRunHooks runHooks() = 0;
  virtual SparseTechnique technique() const = 0;
  // The classic path's worker and server (their counters for the run's report); null for other
  // techniques.
  virtual KvWorker* kvWorker() { return nullptr; }
  virtual const KvServer* kvServer() const { return nullptr; }
};

// What a data path is built from.
struct RowAccessSetup {
  const ShardMap* map = nullptr;
  std::vector<NodeId> members;  // sorted, self included
  Staleness staleness;
  Clock max_clock = 0;  // the run's last clock and one more
  const PsOptions* ps = nullptr;
};

// The data path of `technique` on `node`, holding `store` (this node's home rows, with the
// owners' update policy). Installs its handlers on the node.
std::unique_ptr<SparseRowAccess> makeSparseRowAccess(SparseTechnique technique, node::Node& node,
                                                     KeyStore store, const RowAccessSetup& setup);
// The two paths (makeSparseRowAccess chooses).
std::unique_ptr<SparseRowAccess> makeClassicRowAccess(node::Node& node, KeyStore store,
                                                      const RowAccessSetup& setup);
std::unique_ptr<SparseRowAccess> makeLapseRowAccess(node::Node& node, KeyStore store,
                                                    const RowAccessSetup& setup);

}  // namespace chorus::ps
