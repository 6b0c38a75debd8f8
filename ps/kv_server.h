// The owner side of PS mode: a request handler over the rows this node holds (KeyStore), where
// keys live (KeyDirectory), the SSP gate (SspGate: clocks, parked reads, BSP's held pushes) and
// the wire codec (ps/codec.h). It checks each request, asks the gate when to answer, applies or
// reads the store and encodes the answer; the cores do the rest. Runs on the node's loop thread;
// requests from this node's own worker arrive through the same functions without touching the
// network. Protocol and policies: docs/ps.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/refusal_log.h"
#include "ps/codec.h"
#include "ps/key_directory.h"
#include "ps/key_store.h"
#include "ps/ps_service.h"
#include "ps/ssp.h"
#include "ps/ssp_gate.h"

namespace chorus::node {
class Node;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::ps {

struct ServerOptions {
  // BSP (staleness 0): a push of clock c is held until every live worker finished clock c, then
  // applied in worker order (with momentum per clock: all of the clock's pushes as one step on
  // their mean, KeyStore::applyClock), so that every read at clock c + 1 sees exactly the model
  // after clock c, as the sequential computation does. Without it (SSP, async) pushes apply on
  // arrival and a read may also see some updates of its own clock, which SSP allows.
  bool bsp = false;
  // A worker reported down stops blocking pulls after this long; zero: never (the owner keeps
  // waiting and says every report_every whom it waits for).
  std::chrono::milliseconds down_timeout{10000};
  // How often parked pulls are reported (the log names the workers they wait for).
  std::chrono::milliseconds report_every{5000};
  // The learning rate of a push follows the cluster's progress (the workers' clocks summed,
  // divided by their number) instead of the push's own clock: under a cluster-wide clock budget
  // a fast worker's clocks run ahead of the schedule the run was planned with.
  bool lr_by_progress = false;
  // A restarted owner (--rejoin): pulls and pushes wait until restore() gives the keys their
  // values back, then are answered in arrival order.
  bool hold_until_restored = false;
  // The highest clock a worker of this run can reach (its clock budget, and a little more);
  // a pull, push or PsClock beyond it is refused without touching the clocks (one below 0 or
  // from kClockCeiling on always is). A worker's first message beyond it still counts as
  // evidence of a running job (on_running_job), as any clock it cannot have reached at the start.
  Clock max_clock = Staleness::kInfinite;
  // When set: called once (loop thread) when a worker's first clock, pull or push heard here is
  // from a clock it cannot have reached yet at the start of the job (FIFO connections: a worker
  // announces each clock before using it). This owner then started after the job did, i.e. its
  // node restarted without --rejoin and its keys hold the initial model; from then on it holds
  // every request unanswered, so that no worker takes those values (the node is to stop). Not
  // concluded from a worker whose connection dropped before its first clock arrived: its
  // announcements may have been lost with the connection.
  std::function<void(WorkerId, Clock)> on_running_job;
  // Tests: called on the loop thread with each waiting report (workers behind, clock needed).
  std::function<void(const std::vector<WorkerId>&, Clock)> on_waiting;
  // A cluster resumed from a cut (docs/checkpoints.md): every worker starts at this clock, as
  // every worker of the cut had finished the clocks below it.
  Clock start_clock = 0;
  // At most this many pulls of one worker wait here at a time (parked for a clock, or held
  // until a restarted owner's restore(); held pushes count too): one more is refused with an
  // error naming the worker, which is logged. A worker reads each clock once per owner, and its
  // pulls of a clock wait together, so a worker of a run never comes near it; a peer that parks
  // without bound would hold this owner's memory.
  size_t max_parked_per_worker = 1024;
  // How far a worker's PsClock may run ahead of the most advanced other worker that pulls still
  // wait for (as heard here); further is refused, naming the worker, and moves no clock: a member
  // claiming a far-future clock would otherwise stop counting as the slowest and release every
  // read parked for it. kInfinite: no limit (asynchronous runs, where no read waits). Set it
  // with leadLimit(staleness).
  Clock max_lead = Staleness::kInfinite;
};

// ServerOptions::max_lead for a staleness bound: under a bound s a worker at clock c read with a
// minimum clock of c - 1 - s, so every counted worker had reached it at some owner; what this
// owner has not heard yet is still on its way (pulls may also be served from a worker's cache
// for up to s clocks). 2 (s + 1) + kLeadSlack covers both; unbounded staleness has no limit.
inline constexpr Clock kLeadSlack = 64;
Clock leadLimit(Staleness staleness);

// Answer to a pull: empty `error`, the owner's minimum worker clock and the store to copy the
// values of `keys` from (valid during the call: KeyStore::copyTo); or an error (no store).
using PullAnswer = std::function<void(const std::string& error, Clock min_clock,
                                      std::span<const uint64_t> keys, const KeyStore* store)>;

// What an owner saw over a run; any thread.
struct ServerSummary {
  uint64_t pulls = 0;                  // answered
  uint64_t pushes = 0;                 // applied
  uint64_t errors = 0;                 // requests refused with an error reply
  uint64_t parked = 0;                 // pulls that had to wait
  std::map<WorkerId, Clock> excluded;  // workers dropped after the down time-out, at this clock
  // Workers that announced a clock right after a much lower one (they rejoined after a
  // restart): their updates of the clocks between never came.
  using SkippedClocks = ClockGap;
  std::vector<SkippedClocks> skipped;
};

class KvServer {
 public:
  // `workers` are every member (each node is a worker). Installs the PsPull / PsPush / PsClock
  // handlers on `node`; the node must stop before this object is destroyed.
  KvServer(node::Node& node, KeyStore store, const std::vector<WorkerId>& workers,
           ServerOptions options);
  // The same with where every key lives (the constructor above places every key at its home
  // among `workers`). The store must hold the keys the directory gives this node.
  KvServer(node::Node& node, KeyStore store, KeyDirectory directory,
           const std::vector<WorkerId>& workers, ServerOptions options);
  KvServer(const KvServer&) = delete;
  KvServer& operator=(const KvServer&) = delete;

  // Loop thread. Answers (now or once the slowest live worker reached `min_clock`) with the
  // values of `keys`; an invalid request is answered with an error at once.
  void pull(WorkerId worker, Clock clock, Clock min_clock, std::vector<uint64_t> keys,
            PullAnswer answer);
  // Loop thread. Applies a worker's gradients; the error (nothing applied) or nullopt.
  std::optional<std::string> push(WorkerId worker, Clock clock, std::span<const uint64_t> keys,
                                  std::span<const float> grads);
  // Loop thread. The worker finished every clock below `clock`; error or nullopt.
  std::optional<std::string> clock(WorkerId worker, Clock clock);
  // Loop thread: down/left workers start their time-out; a worker that is up again counts again.
  void onPeerEvent(const node::PeerEvent& event);
  // Loop thread: the worker ran all its clocks (TrainingDone); its departure is expected.
  void workerFinished(WorkerId worker);
  // Loop thread, called periodically: applies down time-outs, reports parked pulls.
  void tick(std::chrono::steady_clock::time_point now);
  // Loop thread: the minimum clock over the live workers (every update from clocks below it is
  // in the store; managed communication stamps the rows it pushes with it).
  Clock minClock() const { return gate_.minClock(); }
  // Loop thread: every worker's clock as this owner knows it.
  std::vector<WorkerView> workerViews() const;
  // Loop thread (reads only): another owner's view of the workers' clocks is one this run can
  // have (SspGate::checkViews); the error or nullopt.
  std::optional<std::string> checkViews(const std::vector<WorkerView>& views) const {
    return gate_.checkViews(views);
  }
  // Loop thread, a restarted owner: sets its keys and clocks (both checked here, the views with
  // checkViews: an error leaves everything as it was) and takes over another owner's view of the
  // workers' clocks (a clock only moves forward; who that owner still counted is not taken over);
  // then answers the requests held since the start.
  std::optional<std::string> restore(std::span<const uint64_t> keys, std::span<const float> values,
                                     const std::vector<WorkerView>& views);

  // Loop thread, whole-cluster checkpoints: runs `snapshot` with the store once every counted
  // worker finished every clock below `clock` and the pushes of those clocks are applied, in
  // the same loop turn, so before any request that arrives later (docs/checkpoints.md). Call it
  // before this node's worker announces `clock`: the snapshot then cannot miss that moment.
  void whenClocksApplied(Clock clock, std::function<void(const KeyStore&)> snapshot);

  // Any thread.
  ServerSummary summary() const;
  // Any thread: the sum of the clocks this owner has heard of from every worker but `self`.
  Clock othersClockTotal(WorkerId self) const;
  // Loop thread: the store (tests and the end-of-run report).
  const KeyStore& store() const { return store_; }
  // Loop thread: where every key lives.
  const KeyDirectory& directory() const { return directory_; }

 private:
  KvServer(node::Node& node, KeyStore store, std::optional<KeyDirectory> directory,
           const std::vector<WorkerId>& workers, ServerOptions options);
  void onPullFrame(WorkerId from, const node::InboundFrame& frame);
  void onPushFrame(WorkerId from, const node::InboundFrame& frame);
  void onClockFrame(WorkerId from, const node::InboundFrame& frame);
  // Applies one push and acknowledges it (or replies with the error). `resent`: the push by
  // keys that replaces a push by slots this owner answered as stale (checkNotBehind skipped).
  void handlePush(WorkerId from, uint64_t request, Clock clock, std::span<const uint64_t> keys,
                  std::span<const float> grads, bool resent);
  // push(), where `resent` skips the check that the clock is not behind the worker's.
  std::optional<std::string> pushChecked(WorkerId worker, Clock clock,
                                         std::span<const uint64_t> keys,
                                         std::span<const float> grads, bool resent);
  // The checks of a pull after the sender's: the run's clocks and the worker's own.
  std::optional<std::string> checkPull(WorkerId worker, Clock clock, Clock min_clock);
  // A push whose rows are in located_ (in the order of `grads`): the finite check, then held
  // (BSP, by `keys`, or the rows' keys when empty) or applied.
  std::optional<std::string> pushLocated(WorkerId worker, Clock clock,
                                         std::span<const uint64_t> keys,
                                         std::span<const float> grads);
  // Requests that name rows by slot (issue 25, ps/key_runs.h SlotRun): no lookup per key. A
  // request for a layout the store no longer has gets a stale reply (the worker asks by keys).
  void onSlotPull(WorkerId from, const PullRequest& request);
  void pullRuns(WorkerId worker, uint64_t id, Clock clock, Clock min_clock, uint64_t layout,
                std::vector<KeyStore::Run> runs);
  void onSlotPush(WorkerId from, const PushRequest& request);
  // Applies the held BSP pushes of every clock below the live workers' minimum.
  void applyDue();
  void replyError(WorkerId to, uint64_t request, wire::PsOp op, const std::string& error);
  // Counts a refused request (summary).
  void countError();
  // A request of `worker` that would wait here (parked or held) is within max_parked_per_worker;
  // the error otherwise.
  std::optional<std::string> checkParkLimit(WorkerId worker, const char* what) const;
  // A PsClock of `worker` at `clock` is within max_lead of the other counted workers.
  std::optional<std::string> checkLead(WorkerId worker, Clock clock) const;
  // Holds a request until restore(), within the park limit; the error otherwise.
  std::optional<std::string> hold(WorkerId worker, const char* what, std::function<void()> request);
  // Asks the gate to answer at `min_clock`, counting the pull against the worker's park limit
  // while it waits; true when it parked.
  bool park(WorkerId worker, Clock min_clock, std::function<void()> release);
  // on_running_job: reports (once) a request of `worker` at `clock` when the job cannot have
  // started with this owner; `first` is the highest clock such a request may have at the start.
  void checkRunningJob(WorkerId worker, Clock clock, Clock first);

  node::Node& node_;
  KeyStore store_;
  KeyDirectory directory_;
  ServerOptions options_;
  SspGate gate_;
  Clock num_workers_;
  bool holding_ = false;  // hold_until_restored, until restore()
  bool running_job_reported_ = false;
  std::vector<std::function<void()>> held_requests_;
  std::map<WorkerId, size_t> waiting_;  // per worker: pulls parked and requests held here
  // Per worker: its pushes by slots this owner answered as stale (their rows moved, or this
  // owner restarted), whose push by keys may come after the worker's next clock announcement
  // (pushes are not waited for before it): that one re-send is not "behind" (at most
  // max_parked_per_worker remembered per worker).
  std::map<WorkerId, std::set<uint64_t>> stale_pushes_;
  node::RefusalLog refusals_;  // rate-limits the log lines of refused requests, per worker
  mutable std::mutex mu_;      // guards summary_ and heard_
  ServerSummary summary_;
  std::map<WorkerId, Clock> heard_;  // each worker's clock, for other threads
  // Loop thread, reused by every message (no allocation per message once grown): the keys a
  // request's runs decode to, and the rows of a pull reply.
  std::vector<Key> key_buffer_;
  std::vector<std::span<const float>> row_buffer_;
  std::vector<KeyStore::Run> located_;     // the rows of the push being applied, run by run
  std::vector<SlotRun> slot_buffer_;       // the slot runs a request names, decoded
  std::vector<uint8_t> slot_bytes_;        // the slot runs a reply hands out, encoded
  std::vector<KeyStore::Run> reply_runs_;  // the rows of the pull being answered
};

}  // namespace chorus::ps
