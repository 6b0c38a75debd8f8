// What every PS run (dense PsPeer, sparse SparsePsPeer) does on its node besides the clocks:
// hears who finished (TrainingDone) and who went down or came back (peer events, passed on to
// the owner and the worker), rings the owner's time-outs and waiting reports on the loop thread
// (a ticker thread), and ends the run with the others: TrainingDone to every member (again to
// one that reconnects later) and the wait until each finished or left. Docs: ps.md ("The end
// of a run").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "node/frame.h"
#include "node/protocol.h"
#include "run/membership.h"

namespace chorus::node {
class Node;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::ps {

class KvServer;
class KvWorker;

// What the barrier tells the run's data path (loop thread), for a path other than KvServer and
// KvWorker (the relocation shell of `--technique lapse`).
struct PsRunHooks {
  std::function<void(node::NodeId)> finished;                       // a peer's TrainingDone
  std::function<void(const node::PeerEvent&)> peer_event;           // every peer event
  std::function<void(std::chrono::steady_clock::time_point)> tick;  // every tick_every
};

class PsRunBarrier {
 public:
  // Installs the TrainingDone and peer-event handlers on `node` and starts the ticker (every
  // `tick_every`, server.tick() on the loop thread). The node must be shut down before this
  // object is destroyed, and this object destroyed before `server`, `worker` and `membership`.
  PsRunBarrier(node::Node& node, KvServer& server, KvWorker& worker, run::Membership& membership,
               std::chrono::milliseconds tick_every);
  // The same with the data path's hooks instead of an owner and a worker (empty hooks are
  // skipped).
  PsRunBarrier(node::Node& node, PsRunHooks hooks, run::Membership& membership,
               std::chrono::milliseconds tick_every);
  // Stops and joins the ticker.
  ~PsRunBarrier();
  PsRunBarrier(const PsRunBarrier&) = delete;
  PsRunBarrier& operator=(const PsRunBarrier&) = delete;

  // Any thread: runs the owner's time-outs now, not only every tick_every (a member that
  // finished or went down may settle the end of the run).
  void tickNow();
  // Trainer thread: tells every other member that this worker ran `clocks_done` clocks
  // (TrainingDone) and waits until each of them finished or left (or stop, or the time-out).
  run::PeerSettlement finish(int64_t clocks_done, const run::SettleOptions& options);

 private:
  node::Node& node_;
  PsRunHooks hooks_;
  run::Membership& membership_;
  std::mutex mu_;
  // This worker's TrainingDone once sent: a peer whose connection was down then gets it again
  // when it comes back up, so that it does not wait for it until the finish time-out.
  node::SharedFrame done_frame_;
  std::condition_variable ticker_cv_;
  bool closing_ = false;
  std::thread ticker_;
};

}  // namespace chorus::ps
