// The network shell around the relocation core (ps/relocation.h): Lapse's rows moving between
// the nodes of a PS job. The core decides everything; this class only
// - runs the core on the node's loop thread (every call of the worker's is posted there),
// - writes what the core sends as PS-service frames (ps/relocation_codec.h: a run of messages of
//   one kind to one peer is one frame, and the order of the messages to each peer is kept, so
//   per-link FIFO holds) and hands the frames peers send to the core, each one checked first;
// - completes the worker's operations (a pull's values land in the caller's buffer) and wakes
//   the trainer thread waiting for them, as KvWorker does;
// - announces this worker's clock c (PsClock to every peer, and to its own core) only once every
//   push it made at clocks below c completed: the core's SSP contract (a forwarded push takes
//   other links than the announcement, so FIFO alone does not say that it arrived);
// - holds the frames for a peer whose connection is not up yet and sends them, in order, when it
//   comes up (members start at different moments; a lost frame would stall a worker);
// - feeds peerDown from the runtime's peer events (after the last frame the peer's connection
//   delivered: events and frames come in order on the loop thread) and logs what was lost.
// A frame a peer sends that cannot be read, or a message the core refuses, is answered with a
// RelocRefusal naming the reason and logged with the peer (rate-limited); the node keeps
// serving. docs/ps-relocation.md has the protocol, docs/sparse-ps.md its use (`--technique
// lapse`).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "node/frame.h"
#include "node/repeated_log.h"
#include "node/send_when_connected.h"
#include "node/status.h"
#include "ps/key_localizer.h"
#include "ps/relocation.h"
#include "ps/relocation_codec.h"

namespace chorus::node {
class Node;
class InboundFrame;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::ps {

struct RelocationShellOptions {
  // The SSP bound of the worker's reads (pull(): the worker's clock minus the bound).
  Staleness staleness;
  // The core's location cache (RelocationOptions::cache_capacity).
  size_t cache_capacity = size_t{1} << 16;
  // Loop thread: called with every peer clock announcement the shell accepted (PsClock). The
  // shell owns the node's PsClock handler; another data path of the node that needs the peers'
  // clocks (--technique auto's classic part: ps/sparse_row_access_auto.cc) hears them here.
  std::function<void(NodeId from, Clock clock)> on_peer_clock;
};

// Counters since the shell started; any thread.
struct RelocationShellStats {
  uint64_t keys_local = 0;   // this worker's reads and writes of rows held here when issued
  uint64_t keys_remote = 0;  // ... of rows held elsewhere (or on their way here)
  uint64_t localized = 0;    // keys this worker asked to localize
  uint64_t localize_failed = 0;
  uint64_t failed_ops = 0;          // pulls and pushes that ended in an error
  uint64_t refused_from_peers = 0;  // peer frames or messages refused (logged with the peer)
  uint64_t lost_keys = 0;           // keys homed here that died with a node (DownReport)
  uint64_t given_up = 0;            // rows awaited here that died on their way
  uint64_t held_keys = 0;           // rows held here now
  RelocationStats core;
};

class RelocationShell {
 public:
  using Handle = uint64_t;

  // This node (`node`, members `members`, self included) of a job placed by `map`, holding the
  // rows of `store` (the keys whose home it is). Installs the relocation and PsClock handlers on
  // `node`, which must be shut down before this object is destroyed.
  RelocationShell(node::Node& node, const ShardMap& map, KeyStore store,
                  std::vector<NodeId> members, RelocationShellOptions options);
  RelocationShell(const RelocationShell&) = delete;
  RelocationShell& operator=(const RelocationShell&) = delete;

  // --- The worker (any thread but the loop's). Keys sorted, unique and in the key space, and
  // buffers of their lengths (std::invalid_argument otherwise). Buffers stay valid until the
  // operation completed.

  // Reads `keys` into `out` under SSP at the worker's clock (every worker reached clock() - s).
  Handle pull(std::span<const Key> keys, std::span<float> out);
  // Reads `keys` once every live worker reached `min_clock`.
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out);
  // Pushes `grads` (copied) for `keys`, made at the worker's current clock.
  Handle push(std::span<const Key> keys, std::span<const float> grads);
  // Blocks until the operation completed: ok, or the first error of its keys (an operation
  // already waited for returns ok).
  node::Status wait(Handle handle);
  // Moves `keys` here; `done` runs once on the loop thread when every key arrived or failed
  // (the first error). A failed localize is harmless: the key is read where it is.
  void localize(std::span<const Key> keys, KeyLocalizer::Done done);
  // Ends the worker's clock; it is announced once the pushes below it completed.
  void clock();
  Clock currentClock() const;
  // Blocks until `worker` (a member; this node too) announced clock `clock`, i.e. every push it
  // made below `clock` completed. An error when `worker` is not a member, went down or left, or
  // the shell was cancelled. Rotation's hand-off waits so for one neighbour, not every worker.
  node::Status waitWorkerClock(NodeId worker, Clock clock);
  // Fails every pending operation with `status`, and every later one at once.
  void cancelAll(const node::Status& status);

  // --- Loop thread.
  // A peer went down or left: peerDown for the core (once per peer), what was lost logged, the
  // frames held for it dropped. A peer came up: the frames held for it are sent, in order.
  void onPeerEvent(const node::PeerEvent& event);
  // `peer` ran all its clocks: its departure later is expected (logged at info level).
  void peerFinished(NodeId peer);

  // Any thread.
  RelocationShellStats stats() const;
  NodeId self() const { return self_; }
  // Is the row of `key` (a key of the space; false otherwise) held here now? A snapshot of the
  // core's store, updated on the loop thread as rows arrive and leave: a read issued right
  // after may find the row gone (another node localized it) or arrived. The sampling schemes'
  // locality oracle (SparseRowAccess::isLocal). O(log tables), no lock.
  bool holdsNow(Key key) const;

  // Tests, and a whole-cluster cut's copy of the rows (ps/sparse_ps_cut.cc): runs `fn` with the
  // core on the loop thread and waits for it.
  void inspect(const std::function<void(const Relocation&)>& fn);

 private:
  struct Operation {
    size_t remaining = 0;
    node::Status status;
    KeyLocalizer::Done done;  // localizes: run on completion (loop thread)
    bool complete = false;
  };
  // One of the core's operations, by its id: the shell operation it belongs to and, for a pull,
  // where its values go.
  struct CoreOp {
    Handle handle = 0;
    float* dest = nullptr;
    size_t floats = 0;
    bool push = false;
    Clock clock = 0;
  };

  void checkKeys(std::span<const Key> keys, size_t floats, const char* what) const;
  Handle begin(size_t parts, KeyLocalizer::Done done);
  // Loop thread: the operation ended already (cancelled) and is to be skipped.
  bool cancelledOp(Handle handle) const;
  // Loop thread: sends what the core made, completes what it completed, announces the clock
  // when it can.
  void flushFromLoop();
  void sendOutgoingFromLoop();
  // Sends `frame` to `to`, or holds it (behind the frames held already) while `to` is not
  // connected yet (outbox_); nothing to a peer that went down.
  void sendFromLoop(NodeId to, const node::SharedFrame& frame);
  void completeFromLoop(const Completion& completion);
  // One part of `handle` ended with `status`.
  void settleFromLoop(Handle handle, const node::Status& status);
  // Announces the worker's clock when its pushes below it completed; true when it did.
  bool announceFromLoop();
  // `worker` announced `clock` (this node's own announcement too): wakes waitWorkerClock.
  void noteAnnouncedFromLoop(NodeId worker, Clock clock);
  void onFrameFromLoop(NodeId from, const node::InboundFrame& frame);
  void onClockFromLoop(NodeId from, const node::InboundFrame& frame);
  void refuseFrameFromLoop(NodeId from, const std::string& reason);
  void countRefusal(NodeId from, const std::string& what);
  // The slot of `key` in held_now_, or SIZE_MAX for a key outside the space.
  size_t heldSlot(Key key) const;
  // Copies the core's answer for `key` (every key) into held_now_; after each core call that
  // may move a row (receive: it names its key; peerDown: any).
  void noteHeldFromLoop(Key key);
  void noteAllHeldFromLoop();

  node::Node& node_;
  NodeId self_;
  std::vector<NodeId> members_;
  RelocationShellOptions options_;
  KeySpace space_;
  Relocation core_;  // loop thread only
  // holdsNow's snapshot: one flag per key of the space (table t's keys from table_slots_[t]),
  // written on the loop thread, read by any thread (relaxed: a hint that may be stale anyway).
  std::vector<size_t> table_slots_;
  std::unique_ptr<std::atomic<bool>[]> held_now_;

  // Loop thread.
  std::unordered_map<uint64_t, CoreOp> core_ops_;
  std::map<Clock, uint64_t> pushes_by_clock_;  // own pushes not completed, by clock
  Clock wanted_clock_ = 0;                     // the clock the worker ended
  Clock announced_ = 0;
  std::set<NodeId> down_;
  std::set<NodeId> finished_;
  node::SendWhenConnected outbox_;  // frames for peers not connected yet
  node::RefusalLog refusals_;

  mutable std::mutex mu_;
  std::condition_variable completed_;
  Clock clock_ = 0;  // the worker's (trainer thread writes, under mu_)
  // The clocks the members announced (this node's own too) and the members gone, for
  // waitWorkerClock; written on the loop thread.
  std::map<NodeId, Clock> announced_by_;
  std::set<NodeId> gone_;
  Handle next_handle_ = 1;
  std::unordered_map<Handle, Operation> operations_;
  std::optional<node::Status> cancelled_;
  RelocationShellStats stats_;
};

}  // namespace chorus::ps
