// Whole-cluster checkpoints of sparse PS runs (docs/checkpoints.md, "Sparse runs"): a node's part
// of a cut and its restore. The loop (ps/sparse_ps_peer.cc) calls takeCut at an epoch's end.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <future>
#include <stdexcept>

#include "node/node.h"
#include "ps/cut_rows.h"
#include "ps/sparse_ps_peer.h"
#include "run/cluster_checkpoint.h"

namespace chorus::ps {

namespace {

// What a resumed node must run alike to take the cut's rows.
constexpr const char* kRemedy =
    "resume with the topology, --technique, --batch and --epochs the checkpoints were written "
    "with";

}  // namespace

bool SparsePsPeer::takeCut(int64_t cut, Clock ssp_clock) {
  spdlog::logger& log = node_.logger();
  settlePush();
  // Any row serves as the barriers' read: the wait is for the clock (at this node's own server
  // under classic, which is what says its rows hold every push before the cut).
  const Key barrier_key = cut_keys_.empty() ? Key{0} : cut_keys_.front();
  std::vector<float> row(space_.length(barrier_key));
  const std::span<const Key> barrier_keys(&barrier_key, 1);
  // Barrier A: every worker announced ssp_clock, i.e. finished the epoch and its pushes completed
  // (a worker announces a clock after its pushes below it: FIFO links under classic, completed
  // pushes under lapse), and it had waited for its localizes before announcing.
  node::Status status = access_->wait(access_->pullAt(ssp_clock, barrier_keys, row));
  if (membership_.stopped()) return false;
  std::string why_not;
  if (!status.ok()) why_not = fmt::format("its barrier read failed ({})", status.message());
  // Lapse: this node's home rows come home, so that each node's part is its home rows (and a
  // resumed run starts with every row at its home, as any run does). No one else moves a row
  // of this node's home until barrier B.
  if (why_not.empty() && options_.technique == SparseTechnique::kLapse && !cut_keys_.empty()) {
    auto arrived = std::make_shared<std::promise<node::Status>>();
    std::future<node::Status> done = arrived->get_future();
    access_->localize(cut_keys_, [arrived](const node::Status& s) { arrived->set_value(s); });
    while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (membership_.stopped()) return false;
    }
    if (const node::Status s = done.get(); !s.ok()) {
      why_not = fmt::format("its home rows did not all come home ({})", s.message());
    }
  }
  CutRows rows;
  if (why_not.empty()) {
    const bool ran = access_->withStore([&](const KeyStore& store) {
      for (Key key : cut_keys_) {
        if (!store.contains(key)) {
          why_not = fmt::format("key {} was not here when its rows were copied", key);
          return;
        }
      }
      rows = copyCutRows(store, cut_keys_);
    });
    if (!ran && why_not.empty()) why_not = "the node stopped";
  }
  if (why_not.empty()) {
    run::NodeCheckpoint part;
    part.header = options_.cuts.header;
    part.header.cut = cut;
    part.words[std::string(run::kProgressSection)] = {
        static_cast<uint64_t>(cut),
        static_cast<uint64_t>(cut) * static_cast<uint64_t>(clocks_per_epoch_)};
    part.words["clocks_per_epoch"] = {static_cast<uint64_t>(clocks_per_epoch_)};
    putCutRows(std::move(rows), part);
    const std::string path = run::writeNodeCheckpoint(options_.cuts.dir, part, options_.cuts.every);
    log.info("epoch {}: wrote this node's part of cut {} ({} rows) to {}", cut, cut,
             cut_keys_.size(), path);
  } else {
    log.warn("cut {}: not written, {}; a resume takes the cut before it", cut, why_not);
  }
  // The cut's own clock, empty: announcing ssp_clock + 1 says this node took its part; barrier B
  // waits for every node's, so no push of the next epoch reaches a row before it was copied.
  access_->clock();
  status = access_->wait(access_->pullAt(ssp_clock + 1, barrier_keys, row));
  if (membership_.stopped()) return false;
  if (!status.ok()) log.warn("cut {}: its second barrier read failed ({})", cut, status.message());
  return true;
}

void SparsePsPeer::restoreCut(KeyStore& store) const {
  const run::NodeCheckpoint& cut = *options_.cuts.resumed;
  const std::string& path = options_.cuts.resumed_path;
  auto it = cut.words.find("clocks_per_epoch");
  if (it == cut.words.end()) {
    throw run::NodeCheckpointError(fmt::format(
        "{}: no 'clocks_per_epoch' array (not a sparse PS checkpoint); {}", path, kRemedy));
  }
  if (it->second.size() != 1 || it->second[0] != static_cast<uint64_t>(clocks_per_epoch_)) {
    throw run::NodeCheckpointError(
        fmt::format("{}: written by a run of {} clocks per epoch, and this one has {}; {}", path,
                    it->second.empty() ? 0 : it->second[0], clocks_per_epoch_, kRemedy));
  }
  restoreCutRows(store, cut, path, kRemedy);
}

}  // namespace chorus::ps
