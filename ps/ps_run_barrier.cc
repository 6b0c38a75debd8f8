#include "ps/ps_run_barrier.h"

#include "node/node.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/ps_service.h"

namespace chorus::ps {

namespace {

PsRunHooks serverHooks(KvServer& server, KvWorker& worker) {
  PsRunHooks hooks;
  hooks.finished = [&server](NodeId from) { server.workerFinished(from); };
  hooks.peer_event = [&server, &worker](const node::PeerEvent& event) {
    server.onPeerEvent(event);
    worker.onPeerEvent(event);
  };
  hooks.tick = [&server](std::chrono::steady_clock::time_point now) { server.tick(now); };
  return hooks;
}

}  // namespace

PsRunBarrier::PsRunBarrier(node::Node& node, KvServer& server, KvWorker& worker,
                           run::Membership& membership, std::chrono::milliseconds tick_every)
    : PsRunBarrier(node, serverHooks(server, worker), membership, tick_every) {}

PsRunBarrier::PsRunBarrier(node::Node& node, PsRunHooks hooks, run::Membership& membership,
                           std::chrono::milliseconds tick_every)
    : node_(node), hooks_(std::move(hooks)), membership_(membership) {
  node_.setHandler(messageType(wire::Body::TrainingDone),
                   [this](NodeId from, const node::InboundFrame&) {
                     if (hooks_.finished) hooks_.finished(from);
                     membership_.finished(from);
                     tickNow();
                   });
  node_.setEventHandler([this](const node::PeerEvent& event) {
    if (hooks_.peer_event) hooks_.peer_event(event);
    if (event.kind == node::PeerEventKind::kDown || event.kind == node::PeerEventKind::kLeft) {
      membership_.down(event.peer);
      tickNow();
    } else if (event.kind == node::PeerEventKind::kUp) {
      membership_.up(event.peer);
      node::SharedFrame done;
      {
        std::lock_guard lock(mu_);
        done = done_frame_;
      }
      if (done) node_.send(event.peer, done);
    }
  });
  // The owner's time-outs and waiting reports run on the loop thread; this thread only rings.
  ticker_ = std::thread([this, tick_every] {
    std::unique_lock lock(mu_);
    while (!closing_) {
      ticker_cv_.wait_for(lock, tick_every);
      if (closing_) break;
      lock.unlock();
      if (hooks_.tick) node_.post([this] { hooks_.tick(std::chrono::steady_clock::now()); });
      lock.lock();
    }
  });
}

PsRunBarrier::~PsRunBarrier() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  ticker_cv_.notify_all();
  ticker_.join();
}

void PsRunBarrier::tickNow() {
  ticker_cv_.notify_all();
}

run::PeerSettlement PsRunBarrier::finish(int64_t clocks_done, const run::SettleOptions& options) {
  node::SharedFrame done =
      encodeMessage(node_, wire::Body::TrainingDone, [&](flatbuffers::FlatBufferBuilder& b) {
        return wire::CreateTrainingDone(b, clocks_done).Union();
      });
  {
    std::lock_guard lock(mu_);
    done_frame_ = done;
  }
  node_.broadcast(membership_.others(), done);
  // Everyone keeps serving its keys until every other member is done or gone.
  return membership_.settle(options, node_.logger());
}

}  // namespace chorus::ps
