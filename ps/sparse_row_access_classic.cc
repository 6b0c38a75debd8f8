// The classic path of sparse PS mode: every row at its home, KvServer and KvWorker.
#include <cmath>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "node/node.h"
#include "node/repeated_log.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/ps_peer.h"
#include "ps/sparse_managed_shell.h"
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
    if (!setup.managed_model.empty()) {
      // --bandwidth: the owners push their changed rows into every worker's copy
      // (ps/sparse_managed_shell.h); the steps' reads take what the copy may serve.
      ManagedCommOptions managed_options;
      managed_options.bandwidth_mbps = setup.ps->bandwidth_mbps;
      // Rows are small (tens of floats): 32 KiB holds hundreds of them, and keeps the bucket's
      // floor (one message to every node) small against a tight budget.
      managed_options.message_bytes = size_t{32} << 10;
      const KeyDirectory* directory_ptr = &directory_;
      managed_ = std::make_unique<SparseManagedComm>(
          node, *server_, server_->store().space(),
          [directory_ptr](Key key) { return directory_ptr->owner(key); }, setup.members,
          setup.managed_model, setup.staleness, managed_options);
    }
  }

  // With --bandwidth, the rows the copy may serve at the worker's clock come from it, and only
  // the others are pulled (into a scratch buffer that wait() scatters into `out`).
  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    if (!managed_) return worker_->pull(keys, out);
    std::vector<size_t> missing;
    managed_->read(keys, worker_->currentClock(), out, missing);
    if (missing.empty()) {
      std::lock_guard lock(mu_);
      return kServed | next_served_++;
    }
    const KeySpace& space = server_->store().space();
    Scatter scatter;
    scatter.out = out;
    std::vector<Key> pulled;
    pulled.reserve(missing.size());
    size_t at = 0;
    size_t next = 0;
    size_t floats = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const size_t n = space.length(keys[i]);
      if (next < missing.size() && missing[next] == i) {
        pulled.push_back(keys[i]);
        scatter.pieces.emplace_back(at, n);
        floats += n;
        ++next;
      }
      at += n;
    }
    scatter.scratch.resize(floats);
    // Moving the scratch vector into the map keeps its buffer, which the pull writes into.
    const Handle handle = worker_->pull(pulled, scatter.scratch);
    std::lock_guard lock(mu_);
    scatters_.emplace(handle, std::move(scatter));
    return handle;
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return worker_->pullAt(min_clock, keys, out);
  }
  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    return worker_->push(keys, grads);
  }
  node::Status wait(Handle handle) override {
    if ((handle & kServed) != 0) return {};
    node::Status status = worker_->wait(handle);
    std::lock_guard lock(mu_);
    auto it = scatters_.find(handle);
    if (it == scatters_.end()) return status;
    if (status.ok()) {
      const Scatter& scatter = it->second;
      size_t from = 0;
      for (const auto& [at, n] : scatter.pieces) {
        std::copy_n(scatter.scratch.begin() + static_cast<std::ptrdiff_t>(from), n,
                    scatter.out.begin() + static_cast<std::ptrdiff_t>(at));
        from += n;
      }
    }
    scatters_.erase(it);
    return status;
  }
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
    if (managed_) {
      const SparseManagedStats m = managed_->stats();
      s.managed_frames = m.comm.frames_sent;
      s.managed_rows_sent = m.comm.rows_sent;
      s.managed_bytes = m.comm.managed_bytes;
      s.managed_rows_received = m.comm.rows_received;
      s.managed_refused = m.comm.refused;
      s.cache_hits = m.cache_hits;
      s.cache_misses = m.cache_misses;
    }
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
  void startRun() override {
    if (managed_) managed_->start();
  }
  bool withStore(const std::function<void(const KeyStore&)>& fn) override {
    // The server's store lives on the loop thread.
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    if (!node_.post([this, &fn, done] {
          fn(server_->store());
          done->set_value();
        })) {
      return false;
    }
    finished.get();
    return true;
  }
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
  // --bandwidth: a pull's rows that the copy did not serve, pulled into `scratch`, and where in
  // the caller's buffer each lands (float offset, floats).
  struct Scatter {
    std::span<float> out;
    std::vector<float> scratch;
    std::vector<std::pair<size_t, size_t>> pieces;
  };
  // Handles of reads the copy served whole (KvWorker's handles count up from 1).
  static constexpr Handle kServed = Handle{1} << 63;
  std::mutex mu_;  // guards scatters_ and next_served_ (pulls may come from the sampler too)
  std::unordered_map<Handle, Scatter> scatters_;
  Handle next_served_ = 0;
  // Declared last, destroyed first: its timer and handler use the server.
  std::unique_ptr<SparseManagedComm> managed_;
};

}  // namespace

std::unique_ptr<SparseRowAccess> makeClassicRowAccess(node::Node& node, KeyStore store,
                                                      const RowAccessSetup& setup) {
  return std::make_unique<ClassicRowAccess>(node, std::move(store), setup);
}

}  // namespace chorus::ps
