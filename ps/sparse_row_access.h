// The seam between sparse PS mode's training loop (ps/sparse_ps_peer.h) and the technique that
// manages its rows (issue 25; docs/sparse-ps.md, "Techniques"). The loop only ever asks
// "pull these rows", "push these gradients", "localize these keys" and "end the clock"; each
// technique answers them its own way:
// - ClassicRowAccess: every row at its home (ShardMap) for the whole run, read and written through
//   KvWorker and KvServer; localize does nothing.
// - LapseRowAccess: rows move to the node that localizes them (ps/relocation_shell.h, Lapse).
// - NupsRowAccess: the hot keys have a replica on every node, read and pushed locally and synced
//   in the background (ps/replica_shell.h, NuPS); the other keys are relocated as under lapse.
// - AutoRowAccess: each key's technique chosen by chooseTechniques (ps/technique_choice.h):
//   replicated and relocated keys on nups's path, the keys left at their homes on classic's
//   (KvWorker and KvServer: batched by owner, rows named by slot, the optimizer batched).
// makeSparseRowAccess() chooses; the loop does not change. The sampling primitives
// (ps/sample_worker.h) use the same seam: pull for the sampled rows' values, localize for the
// keys a scheme wants here ahead of use, isLocal as the schemes' "is this key local now?".
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/status.h"
#include "ps/key_localizer.h"
#include "ps/key_store.h"
#include "ps/ps_run_barrier.h"
#include "ps/replica_choice.h"
#include "ps/ssp.h"
#include "ps/technique_choice.h"
#include "ps/update_policy.h"

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
  kNups,     // replication of the hot keys, relocation of the others (NuPS)
  kAuto,     // each key's technique from what the workers will access (ps/technique_choice.h)
};
// "classic", "lapse", "nups" or "auto".
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
  // auto: reads and writes of the keys left at their homes, served by the classic path (KvWorker
  // and KvServer; part of keys_local and keys_remote). 0 for the other techniques.
  uint64_t keys_home = 0;
  // nups: the hot keys' replicas (all zero for the other techniques).
  uint64_t replicated_keys = 0;         // keys with a replica on every node
  uint64_t keys_replica = 0;            // reads and writes served by a replica (part of keys_local)
  uint64_t replica_rounds = 0;          // sync rounds finished here
  uint64_t replica_lost_deltas = 0;     // (round, node) pairs whose delta a round lost
  uint64_t replica_bytes_sent = 0;      // the sync's frames, on the wire
  double replica_staleness_mean_s = 0;  // the replicas' age (ReplicaShellCounters::staleness),
  double replica_staleness_max_s = 0;   // sampled at every clock: its mean and maximum
  // XXH3 of the replicas' value floats (key order) once drained (finishPushes): equal on every
  // node that drained. 0 before.
  uint64_t replica_digest = 0;
  // --bandwidth (classic; docs/managed-comm.md, "Sparse rows"): the owners' pushed rows.
  uint64_t managed_frames = 0;         // PsRowPush frames sent (one per worker and message)
  uint64_t managed_rows_sent = 0;      // rows in them (each counted once per worker)
  uint64_t managed_bytes = 0;          // their bytes, as charged to the budget
  uint64_t managed_rows_received = 0;  // rows other owners pushed to this worker
  uint64_t managed_refused = 0;        // frames refused (named in the log)
  uint64_t cache_hits = 0;             // row reads served by the pushed rows
  uint64_t cache_misses = 0;           // row reads pulled from their owners
};

// --technique nups: which keys get a replica on every node, and how often replicas sync
// (docs/ps-replication.md, "In sparse PS mode").
struct ReplicationOptions {
  // The expected accesses of every table's rows (the skew layer's pre-scan: ml::kgAccessStats,
  // ml::mfAccessStats), one entry per table of the key space; an empty entry: none of that
  // table's keys is replicated.
  std::vector<TableAccesses> accesses;
  // --replicate N: the N most accessed keys, whatever their memory; nullopt: as many as fit
  // budget_bytes.
  std::optional<size_t> replicate;
  // --replica-bytes: the replicas' memory on each node (values, optimizer state, synced copy and
  // delta: ReplicaSet::bytesPerRow).
  uint64_t budget_bytes = uint64_t{1} << 20;
  // --replica-syncs-per-s: rounds a node's timer starts per second (NuPS's default 25; 0: the
  // replicas sync only at the end of the run).
  double syncs_per_second = 25;
  // --technique auto: what each node's shard is expected to access (one entry per member, in
  // member order, each one TableAccesses per table in accesses per epoch: ps/technique_choice.h).
  // auto reads these instead of `accesses`, and budget_bytes is its replicas' memory cap.
  std::vector<std::vector<TableAccesses>> node_accesses;
};
// The hot keys of `space` under `options` for rows updated with `policy` (the same on every
// node: the accesses and the ties' order are). std::invalid_argument when the accesses do not
// match the key space.
ReplicaChoice chooseHotKeys(const KeySpace& space, const ReplicationOptions& options,
                            const UpdatePolicy& policy);
// --technique auto's choice (chooseTechniques over options.node_accesses, the window from
// options.syncs_per_second at an assumed 25 steps a second: autoWindowClocks) for a run of
// `clocks_per_epoch` clocks per epoch and `total_clocks` in all. std::invalid_argument when the
// accesses do not match the key space.
TechniqueChoice chooseAutoTechniques(const KeySpace& space, const ReplicationOptions& options,
                                     const UpdatePolicy& policy, int64_t clocks_per_epoch,
                                     int64_t total_clocks);

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
  // Blocks until `worker` (a member, this node included) announced clock `clock`: every push it
  // made at the clocks below `clock` completed. Rotation's hand-off (ps/rotation_driver.h) waits
  // so for the one worker whose column block it takes next. An error when `worker` went down
  // (the wait would never end) or the path was cancelled; a technique without per-worker clocks
  // refuses (the relocation path has them: sparse_row_access_lapse.cc).
  virtual node::Status waitWorkerClock(NodeId /*worker*/, Clock /*clock*/) {
    return {node::ErrorCode::kInvalidArgument,
            "this technique does not wait for one worker's clock (only --technique lapse does)"};
  }
  // Any thread: every pending and later operation fails with `status`.
  virtual void cancelAll(const node::Status& status) = 0;
  virtual RowAccessStats stats() const = 0;
  // What the end-of-run barrier tells the data path (peer events, TrainingDone, ticks).
  virtual PsRunHooks runHooks() = 0;
  virtual SparseTechnique technique() const = 0;
  // Trainer thread, once the node runs, before the first clock: starts what runs in the
  // background (the replica sync's timer).
  virtual void startRun() {}
  // Trainer thread, after the worker's last push completed and before the end-of-run read:
  // makes every push of every live node visible here (nups: the replicas drain, so node 0's
  // evaluation reads the converged values). An error (logged by the caller) when `timeout`
  // passed first; the run goes on.
  virtual node::Status finishPushes(std::chrono::milliseconds /*timeout*/) { return {}; }
  // Trainer thread, at a whole-cluster cut (docs/checkpoints.md, "Sparse runs"): runs `fn` on
  // the loop thread with the store of the rows held here, and waits for it. False (fn not run)
  // when the node stopped, or for a technique whose state a cut does not hold (nups and auto:
  // their replicas).
  virtual bool withStore(const std::function<void(const KeyStore&)>& /*fn*/) { return false; }
  // Loop thread: peer `from` announced its worker's clock `clock` to another data path of this
  // node, which owns the node's PsClock handler (auto: its relocation shell tells its classic
  // part, whose worker announces nothing itself). Clocks may jump; a path that needs every
  // clock steps through them. The default ignores it.
  virtual void hearPeerClock(NodeId /*from*/, Clock /*clock*/) {}
  // The classic path's worker and server (their counters for the run's report); null for other
  // techniques.
  virtual KvWorker* kvWorker() { return nullptr; }
  virtual const KvServer* kvServer() const { return nullptr; }
};

// The hot keys' replicas of a nups data path (empty keys: nothing is replicated, and the path is
// lapse's exactly).
struct ReplicaSetup {
  std::vector<Key> keys;       // sorted, unique, in the key space
  std::vector<float> initial;  // their value floats in key order, the same on every node
  std::shared_ptr<const UpdatePolicy> policy;  // the owners' (the store's) update rule
  double syncs_per_second = 25;
  // The technique the log lines name ("nups" or "auto"): auto relocates only some of the others.
  SparseTechnique technique = SparseTechnique::kNups;
};

// What a data path is built from.
struct RowAccessSetup {
  const ShardMap* map = nullptr;
  std::vector<NodeId> members;  // sorted, self included
  Staleness staleness;
  Clock max_clock = 0;  // the run's last clock and one more
  const PsOptions* ps = nullptr;
  ReplicaSetup replicas;  // nups and auto
  // auto: the keys a localize moves (sorted); a localize leaves every other key where it is.
  std::vector<Key> relocated;
  // classic with --bandwidth (managed communication): every key's initial floats in key order
  // (KeySpace::total(), the same on every node), which the worker's copy of the rows starts
  // from. Empty: no managed communication.
  std::vector<float> managed_model;
  // classic: false: the worker's clocks go to this node's server only, and the peers' clocks
  // come in through hearPeerClock (auto's classic part: its relocation shell announces them).
  bool announce_clock = true;
  // lapse, nups: called on the loop thread with every peer clock the relocation shell accepted
  // (RelocationShellOptions::on_peer_clock).
  std::function<void(NodeId, Clock)> on_peer_clock;
};

// The data path of `technique` on `node`, holding `store` (this node's home rows, with the
// owners' update policy). Installs its handlers on the node.
std::unique_ptr<SparseRowAccess> makeSparseRowAccess(SparseTechnique technique, node::Node& node,
                                                     KeyStore store, const RowAccessSetup& setup);
// The paths (makeSparseRowAccess chooses).
std::unique_ptr<SparseRowAccess> makeClassicRowAccess(node::Node& node, KeyStore store,
                                                      const RowAccessSetup& setup);
std::unique_ptr<SparseRowAccess> makeLapseRowAccess(node::Node& node, KeyStore store,
                                                    const RowAccessSetup& setup);
std::unique_ptr<SparseRowAccess> makeNupsRowAccess(node::Node& node, KeyStore store,
                                                   const RowAccessSetup& setup);
std::unique_ptr<SparseRowAccess> makeAutoRowAccess(node::Node& node, KeyStore store,
                                                   const RowAccessSetup& setup);

}  // namespace chorus::ps
