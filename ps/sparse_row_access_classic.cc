// The classic path of sparse PS mode: every row at its home, KvServer and KvWorker.
#include <cmath>
#include <optional>
#include <string>
#include <unordered_map>

#include "node/node.h"
#include "node/repeated_log.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/ps_peer.h"
#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

class ClassicRowAccess final : public SparseRowAccess {
 public:
  ClassicRowAccess(node::Node& node, KeyStore store, const RowAccessSetup& setup)
      : node_(node), self_(node.id()), directory_(*setup.map, store.space()) {
    const KeyDirectory& directory = directory_;
    ServerOptions server_options;
    server_options.down_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::llround(setup.ps->down_timeout_s * 1000.0)));
    server_options.report_every = setup.ps->report_every;
    server_options.bsp = !setup.staleness.infinite() && setup.staleness.bound == 0;
    server_options.max_clock = setup.max_clock;
    server_options.on_waiting = setup.ps->on_owner_waiting;
    server_ = std::make_unique<KvServer>(node, std::move(store), directory, setup.members,
                                         server_options);
    WorkerOptions worker_options;
    worker_options.staleness = setup.staleness;
    // A step pushes a gradient for nearly every row it read, which invalidates the row in the
    // cache (AdaGrad's update cannot be replayed on a cached row without the state): no cache.
    worker_options.cache = false;
    worker_options.report_every = setup.ps->report_every;
    worker_options.on_waiting = setup.ps->on_worker_waiting;
    worker_options.announce_to_peers = setup.announce_clock;
    worker_ =
        std::make_unique<KvWorker>(node, *server_, directory, OwnerOptimizer{}, worker_options);
    held_ = server_->store().size();
  }

  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    return worker_->pull(keys, out);
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return worker_->pullAt(min_clock, keys, out);
  }
  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    return worker_->push(keys, grads);
  }
  node::Status wait(Handle handle) override { return worker_->wait(handle); }
  // Every row stays at its home: nothing to move.
  void localize(std::span<const Key> /*keys*/, KeyLocalizer::Done done) override {
    if (done) done(node::Status{});
  }
  // Fixed placement: the rows whose home this node is, for the whole run (KvWorker reads them
  // from this node's KvServer without a frame).
  bool isLocal(Key key) const override { return directory_.owner(key) == self_; }
  void clock() override { worker_->clock(); }
  // Loop thread. The server takes a worker's clocks one by one (a jump reads as lost updates):
  // the clocks between the last one heard from `from` and `clock` are stepped through.
  void hearPeerClock(NodeId from, Clock clock) override {
    Clock& heard = heard_[from];
    for (Clock next = heard + 1; next <= clock; ++next) {
      if (std::optional<std::string> error = server_->clock(from, next)) {
        if (refusals_.count(from)) {
          node_.logger().warn("classic: clock {} of node {}: {}", next, from, *error);
        }
        return;  // the server refused it (and counted it): the later ones would be refused too
      }
      heard = next;
    }
  }
  void cancelAll(const node::Status& status) override { worker_->cancelAll(status); }
  RowAccessStats stats() const override {
    const WorkerStats w = worker_->stats();
    RowAccessStats s;
    s.keys_local = w.keys_local;
    s.keys_remote = w.keys_remote;
    s.held_keys = held_;
    return s;
  }
  PsRunHooks runHooks() override {
    PsRunHooks hooks;
    KvServer& server = *server_;
    KvWorker& worker = *worker_;
    hooks.finished = [&server](NodeId from) { server.workerFinished(from); };
    hooks.peer_event = [&server, &worker](const node::PeerEvent& event) {
      server.onPeerEvent(event);
      worker.onPeerEvent(event);
    };
    hooks.tick = [&server](std::chrono::steady_clock::time_point now) { server.tick(now); };
    return hooks;
  }
  SparseTechnique technique() const override { return SparseTechnique::kClassic; }
  KvWorker* kvWorker() override { return worker_.get(); }
  const KvServer* kvServer() const override { return server_.get(); }

 private:
  node::Node& node_;
  NodeId self_;
  // Never changes (classic placement): read by isLocal from any thread.
  const KeyDirectory directory_;
  std::unique_ptr<KvServer> server_;
  std::unique_ptr<KvWorker> worker_;
  uint64_t held_ = 0;
  // hearPeerClock's (loop thread): the last clock handed to the server, per peer.
  std::unordered_map<NodeId, Clock> heard_;
  node::RefusalLog refusals_;
};

}  // namespace

std::unique_ptr<SparseRowAccess> makeClassicRowAccess(node::Node& node, KeyStore store,
                                                      const RowAccessSetup& setup) {
  return std::make_unique<ClassicRowAccess>(node, std::move(store), setup);
}

}  // namespace chorus::ps
