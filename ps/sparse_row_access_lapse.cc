// The lapse path of sparse PS mode: rows relocated to where they are used (ps/relocation_shell.h).
#include "node/node.h"
#include "ps/relocation_shell.h"
#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

class LapseRowAccess final : public SparseRowAccess {
 public:
  LapseRowAccess(node::Node& node, KeyStore store, const RowAccessSetup& setup)
      : shell_(node, *setup.map, std::move(store), setup.members,
               RelocationShellOptions{.staleness = setup.staleness,
                                      .on_peer_clock = setup.on_peer_clock}) {}

  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    return shell_.pull(keys, out);
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return shell_.pullAt(min_clock, keys, out);
  }
  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    return shell_.push(keys, grads);
  }
  node::Status wait(Handle handle) override { return shell_.wait(handle); }
  node::Status waitWorkerClock(NodeId worker, Clock clock) override {
    return shell_.waitWorkerClock(worker, clock);
  }
  void localize(std::span<const Key> keys, KeyLocalizer::Done done) override {
    shell_.localize(keys, std::move(done));
  }
  // The rows held here now (the shell's snapshot, updated on the loop thread as rows arrive
  // and leave).
  bool isLocal(Key key) const override { return shell_.holdsNow(key); }
  void clock() override { shell_.clock(); }
  void cancelAll(const node::Status& status) override { shell_.cancelAll(status); }
  RowAccessStats stats() const override {
    const RelocationShellStats r = shell_.stats();
    RowAccessStats s;
    s.keys_local = r.keys_local;
    s.keys_remote = r.keys_remote;
    s.localized = r.localized;
    s.localize_failed = r.localize_failed;
    s.held_keys = r.held_keys;
    return s;
  }
  PsRunHooks runHooks() override {
    PsRunHooks hooks;
    hooks.finished = [this](NodeId from) { shell_.peerFinished(from); };
    hooks.peer_event = [this](const node::PeerEvent& event) { shell_.onPeerEvent(event); };
    return hooks;
  }
  SparseTechnique technique() const override { return SparseTechnique::kLapse; }
  bool withStore(const std::function<void(const KeyStore&)>& fn) override {
    bool ran = false;
    shell_.inspect([&](const Relocation& core) {
      fn(core.store());
      ran = true;
    });
    return ran;
  }
  RelocationShell& shell() { return shell_; }

 private:
  RelocationShell shell_;
};

}  // namespace

std::unique_ptr<SparseRowAccess> makeLapseRowAccess(node::Node& node, KeyStore store,
                                                    const RowAccessSetup& setup) {
  return std::make_unique<LapseRowAccess>(node, std::move(store), setup);
}

}  // namespace chorus::ps
