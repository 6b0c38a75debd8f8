// The worker side of PS mode, in the shape of ps-lite's KVWorker: asynchronous pull and push of
// sorted, unique keys, each returning a handle to wait on (or a completion callback), and
// clock() to end an iteration. Requests to one owner travel as one message; keys this node owns
// go straight to its own KvServer on the loop thread, never over the network. A row cache
// serves reads that are fresh enough under SSP (docs/ps.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "node/frame.h"
#include "node/status.h"
#include "ps/key_directory.h"
#include "ps/key_space.h"
#include "ps/key_store.h"
#include "ps/ps_service.h"
#include "ps/shard_map.h"
#include "ps/ssp.h"

namespace chorus::node {
class Node;
class InboundFrame;
class AttachmentLanding;
struct PeerEvent;
}  // namespace chorus::node
namespace chorus::wire {
struct PsReply;
}

namespace chorus::ps {

class KvServer;

struct WorkerOptions {
  Staleness staleness;
  // Use the row cache (reads fresh enough under SSP are served locally). Fully asynchronous
  // workers never use it: with no bound, a cached row would never have to be read again.
  bool cache = true;
  // How often a wait() that is still pending logs the owners it waits for.
  std::chrono::milliseconds report_every{5000};
  // Tests: called on the waiting thread with the clock and the owners still to answer.
  std::function<void(Clock, const std::vector<NodeId>&)> on_waiting;
  // false: clock() tells only this node's own server; the other owners hear the worker's clocks
  // from another data path of the node, which must announce clock c to an owner only after
  // this worker's pushes of clocks below c were sent to it (FIFO links: --technique auto's
  // relocation shell, which announces after its own pushes and so after these).
  bool announce_to_peers = true;
};

// Counters since the worker started; any thread.
struct WorkerStats {
  uint64_t keys_local = 0;       // key reads/writes served by this node's own KvServer
  uint64_t keys_remote = 0;      // key reads/writes sent to other owners
  uint64_t messages_sent = 0;    // PsPull/PsPush frames (one per owner and request)
  uint64_t cache_hits = 0;       // key reads served from the row cache
  uint64_t cache_misses = 0;     // key reads sent to an owner
  uint64_t failed_requests = 0;  // owner sub-requests that ended in an error
  uint64_t by_slots = 0;         // sub-requests that named their rows by slot (no key sent)
  uint64_t resent_by_keys = 0;   // of those, sent again by keys (the owner's rows had moved)
};

class KvWorker {
 public:
  using Handle = uint64_t;
  // Runs once when an operation completed, on the loop thread (or the calling thread when it
  // completed at once).
  using Callback = std::function<void(const node::Status&)>;

  // `local` is this node's own server. `optimizer` must be the owners' (the cache applies this
  // worker's own pushes with it, so that the worker reads its own writes). Takes the node's
  // PsReply frames (and reads the values of pull replies straight into the callers' buffers);
  // the node must be shut down before the worker is destroyed. Every key is read from and
  // pushed to its home in `map`.
  KvWorker(node::Node& node, KvServer& local, const ShardMap& map, const KeySpace& space,
           OwnerOptimizer optimizer, WorkerOptions options);
  // The same with where every key lives (this worker's view of the directory: requests go to
  // each key's owner in it).
  KvWorker(node::Node& node, KvServer& local, KeyDirectory directory, OwnerOptimizer optimizer,
           WorkerOptions options);
  KvWorker(const KvWorker&) = delete;
  KvWorker& operator=(const KvWorker&) = delete;

  // Reads `keys` (sorted, unique, in the key space: std::invalid_argument otherwise) into `out`,
  // the keys' floats one after the other; `out` must stay valid until the operation completes.
  // The work and the bytes sent grow with the keys asked for, never with the key space.
  // The values hold every update of clocks <= clock() - s - 1 and this worker's own pushes.
  Handle pull(std::span<const Key> keys, std::span<float> out, const Callback& done = {});
  // Reads with an explicit SSP condition: every live worker reached `min_clock`, bypassing the
  // cache (the end-of-run read of the owners' model uses the last clock).
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out,
                const Callback& done = {});
  // Sends gradients for `keys` (the floats of each key in order; copied before returning); the
  // owners apply their optimizer.
  Handle push(std::span<const Key> keys, std::span<const float> grads, const Callback& done = {});
  // The same without the copy: the frames are written from `grads`, which must stay valid and
  // unchanged until the operation completed (even when it fails or is cancelled, it completes
  // only once no frame points at them any more).
  Handle pushInPlace(std::span<const Key> keys, std::span<const float> grads,
                     const Callback& done = {});
  // Blocks until the operation completed; its status (an owner's error reply, or the owner went
  // down). An operation with a callback is forgotten once complete: wait() then returns ok.
  node::Status wait(Handle handle);
  // Ends this worker's iteration: tells every owner that all clocks below the new one are done.
  void clock();
  // The worker's clock (iterations finished).
  Clock currentClock() const;
  // A restarted worker (--rejoin): moves its clock forward to `clock` and tells every owner, as
  // clock() does, before its first read.
  void resumeAt(Clock clock);
  // Before the first operation: the buffer this worker's pulls of every key land in (the
  // model's flat parameters, KeySpace::total() floats), for lastRead(). It must outlive the
  // worker.
  void setModelView(std::span<const float> model);
  // Loop thread: appends the values this worker last read for `keys` (sorted, in the space)
  // to `out`, from the model view; an error when there is none. Safe against the pulls that
  // write the view: those are completed on the loop thread, or served from the cache under
  // this worker's lock, which this holds. `read_clock` is set to how fresh those values are:
  // every update from clocks below it is in each of them (the oldest stamp among the keys'
  // last reads; -1 when some key was never read).
  std::optional<std::string> lastRead(std::span<const Key> keys, std::vector<float>& out,
                                      Clock& read_clock) const;

  // Managed communication, loop thread: `owner`'s fresh values of `keys` (sorted, unique, each
  // owned by `owner`; their floats one key after the other), every update from clocks below
  // `min_clock` in them, replace the cached rows (the newest arrival from an owner is its
  // freshest: connections are FIFO). The error (nothing cached) or nullopt; ignored without
  // the cache.
  std::optional<std::string> offerRows(NodeId owner, Clock min_clock, std::span<const Key> keys,
                                       std::span<const float> values);

  // Any thread: fails every pending operation with `status` (the run stops or the node shuts
  // down, and no reply will come), and every later one at once. An operation whose buffer a
  // socket is reading into or writing from completes when that ends.
  void cancelAll(const node::Status& status);
  // Loop thread: requests to an owner that went down fail at once; an owner that comes back up
  // hears this worker's latest clock again.
  void onPeerEvent(const node::PeerEvent& event);
  WorkerStats stats() const;

 private:
  struct Operation {
    size_t remaining = 0;
    node::Status status;
    Callback done;
    bool complete = false;
  };
  // Pull: keys of a sub-request whose floats lie next to each other in the caller's buffer.
  struct DestRun {
    float* at = nullptr;
    size_t floats = 0;
    size_t keys = 0;
  };
  // One owner's part of a key set: its keys, where their floats lie in the caller's buffer (as
  // offsets: the same for a pull's destination and a push's gradients), and, once the owner
  // handed them out, the slot runs that name the same rows in its store (issue 25).
  struct PartRun {
    size_t offset = 0;
    size_t floats = 0;
    size_t keys = 0;
  };
  struct OwnerPart {
    NodeId owner = 0;
    std::shared_ptr<const std::vector<Key>> keys;
    std::vector<PartRun> runs;
    size_t floats = 0;
    std::vector<uint8_t> slots;  // encoded SlotRuns, empty until learned; valid at `layout`
    uint64_t layout = 0;
  };
  // A key set resolved to owners once (KvWorker::planFor): kept while its keys repeat (a dense
  // model's every clock, the benchmark's messages), so that a repeated request does no work per
  // key on this side and names no key on the wire.
  struct KeyPlan {
    std::vector<Key> keys;           // kept (to compare) only when `cached`
    uint64_t directory_version = 0;  // the directory it was resolved with
    bool cached = false;
    std::vector<OwnerPart> parts;  // by owner
  };
  struct SubRequest {
    Handle handle = 0;
    NodeId owner = 0;
    bool pull = false;
    // The keys asked for (shared with the encoding of the request, which runs unlocked); for a
    // pull, where their floats go, run by run in key order, and how many floats they hold.
    std::shared_ptr<const std::vector<Key>> keys;
    std::vector<DestRun> dest;
    size_t floats = 0;
    // The caller's memory is in use on the loop thread: frames are written from it (pushes) or
    // a reply is read into it. The sub-request cannot complete before that ends (release()):
    // an ending that comes first is kept in `outcome`.
    uint32_t busy = 0;
    std::optional<node::Status> outcome;
    // What a request by slots needs to be sent again by keys when the owner's rows moved
    // (a stale reply): its plan part, clocks, and for a push the gradients' pieces (the
    // caller's, or `values`, this sub-request's copy).
    std::shared_ptr<KeyPlan> plan;
    size_t part = 0;
    Clock clock = 0;
    Clock min_clock = 0;
    std::vector<std::span<const float>> pieces;
    std::vector<float> values;
    bool by_slots = false;
    bool resent = false;
  };
  class ReplyLanding;
  struct CachedRow {
    Clock stamp = 0;
    std::vector<float> values;
  };

  // Throws std::invalid_argument unless `keys` are sorted, unique and in the space and hold
  // exactly `floats_given` floats.
  void checkRequest(std::span<const Key> keys, size_t floats_given, const char* what) const;
  Handle pullImpl(std::optional<Clock> min_clock, std::span<const Key> keys, std::span<float> out,
                  const Callback& done);
  // Registers an operation of `parts` sub-requests (completes at once when 0).
  Handle begin(size_t parts, const Callback& done, std::unique_lock<std::mutex>& lock);
  // Tells every owner (and this node's) that this worker reached `clock`.
  void announceClock(Clock clock);
  node::SharedFrame clockFrame(Clock clock);
  Handle pushImpl(std::span<const Key> keys, std::span<const float> grads, const Callback& done,
                  bool in_place);
  // Completes one sub-request; for a pull, copies the values and refreshes the cache.
  void finishSub(uint64_t request, const node::Status& status, Clock min_clock,
                 std::span<const uint64_t> keys, std::span<const float> values);
  // Loop thread: an owner's reply (PsReply frame; the worker registers itself for them).
  void onReply(NodeId from, const node::InboundFrame& frame);
  // Loop thread: where the values of a pull reply go (the caller's buffer), or null when the
  // reply does not match its request (onReply then reports why).
  std::unique_ptr<node::AttachmentLanding> placeReply(NodeId from, const wire::PsReply& reply,
                                                      size_t bytes);
  // A busy sub-request's memory is free again; `status` is how that ended (an error fails it).
  void release(uint64_t request, const node::Status& status);
  // The error of a pull reply from `owner` whose `values` are not all finite (nothing is used).
  node::Status nonFiniteReply(NodeId owner, std::span<const float> values) const;
  // Under mu_: checks the values a reply landed in the caller's buffer; rows that are not all
  // finite are put back from the cache when it has them, and the pull fails.
  node::Status checkLandedLocked(const SubRequest& sub);
  // Under mu_: the values of a pull are in the caller's buffer (copied or landed); updates the
  // stamps and the cache.
  void recordPullLocked(const SubRequest& sub, Clock min_clock);
  // Under mu_: the plan of `keys` (from plans_ when they were resolved before with the current
  // directory); keys for which skip(key, float offset) is true (rows served from the cache)
  // are left out, and such a plan is never kept.
  std::shared_ptr<KeyPlan> planFor(std::span<const Key> keys);
  template <typename Skip>
  void groupKeys(std::span<const Key> keys, Skip&& skip, KeyPlan& plan) const;
  // Under mu_: a pull reply handed out its keys' slot runs: kept in the sub-request's plan.
  void learnSlotsLocked(const SubRequest& sub, std::span<const uint8_t> slots, uint64_t layout);
  // The owner's rows named by slot moved (a stale reply): forgets the slots and sends the
  // request again by keys (once); false when it cannot (then it fails as a refusal).
  bool resendByKeys(uint64_t request);
  // Under mu_: removes the sub-request and counts `result` into its operation; the callback to
  // run once unlocked (set when the operation completed with one) and its status.
  Callback settleLocked(uint64_t request, const node::Status& result, node::Status* final_status);

  node::Node& node_;
  KvServer& local_;
  KeyDirectory directory_;  // where each key is read from and pushed to
  const KeySpace& space() const { return directory_.space(); }
  OwnerOptimizer optimizer_;
  WorkerOptions options_;
  RowCacheRule fresh_;
  NodeId self_;
  std::vector<NodeId> others_;

  // Loop thread: the last clock announced to the other owners. An owner whose connection
  // dropped may have missed announcements (frames to a disconnected peer are not resent), and
  // under a bound it would wait for them for ever: it hears this again when it comes back up.
  Clock announced_ = 0;

  mutable std::mutex mu_;
  std::condition_variable completed_;
  Clock clock_ = 0;
  Handle next_handle_ = 1;
  uint64_t next_request_ = 1;
  std::map<Handle, Operation> operations_;
  std::unordered_map<uint64_t, SubRequest> requests_;
  std::unordered_map<Key, CachedRow> cache_;
  // Key sets seen twice are kept resolved (planFor): by a hash of their keys; `seen_` holds the
  // hashes of the last sets seen once, so that key sets that never repeat (sampled batches)
  // are not copied.
  std::unordered_map<uint64_t, std::shared_ptr<KeyPlan>> plans_;
  size_t planned_keys_ = 0;  // keys of every kept plan together
  std::vector<uint64_t> seen_;
  size_t seen_next_ = 0;
  // Where pulls of every key land (setModelView): what a restarted owner gets its keys back
  // from. Read, never copied per pull.
  std::span<const float> model_view_;
  // Per key, the stamp of its last successful read into the model view (min_clock of the
  // answer; -1: never read there). Sized by setModelView(): a worker without a model view keeps
  // nothing per key of the space.
  std::vector<Clock> read_stamps_;
  bool inModelView(const float* p) const {
    return !model_view_.empty() && p >= model_view_.data() &&
           p < model_view_.data() + model_view_.size();
  }
  std::set<NodeId> down_owners_;
  std::optional<node::Status> cancelled_;  // set by cancelAll()
  WorkerStats stats_;
};

}  // namespace chorus::ps
