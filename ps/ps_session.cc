#include "ps/ps_session.h"

#include <fmt/format.h>

#include <utility>

namespace chorus::ps {
namespace {

class PsRun : public run::TrainingRun {
 public:
  PsRun(node::Node& node, run::NodeJob job, std::vector<NodeId> members, const PsOptions& options)
      : peer_(node, std::move(job), std::move(members), options) {}

  run::TrainingOutcome run() override {
    const PsReport report = peer_.run();
    run::TrainingOutcome out;
    out.steps = "clocks";
    out.loop = report;
    const uint64_t reads = report.worker.cache_hits + report.worker.cache_misses;
    out.waiting = fmt::format("waiting for reads, {:.0f}% of reads from the cache",
                              reads > 0 ? 100.0 * static_cast<double>(report.worker.cache_hits) /
                                              static_cast<double>(reads)
                                        : 0.0);
    if (report.rejoined_from) {
      out.before.push_back(fmt::format(
          "rejoined at clock {} with its keys from node {}'s last read (the freshest answer: "
          "every update from clocks below {} in it)",
          report.first_clock, *report.rejoined_from, report.rejoin_read_clock));
    }
    if (report.owner_accuracy) {
      out.after.push_back(fmt::format("test accuracy of the model as held by the owners: {:.2f}%",
                                      100 * *report.owner_accuracy));
    }
    for (const auto& [worker, clock] : report.server.excluded) {
      out.after.push_back(
          fmt::format("node {} was dropped at clock {}: its updates from clock {} on are lost",
                      worker, clock, clock));
    }
    for (const ServerSummary::SkippedClocks& gap : report.server.skipped) {
      out.after.push_back(fmt::format(
          "node {} went from clock {} to clock {} (it rejoined): its updates of clocks {}-{} "
          "are lost",
          gap.worker, gap.from, gap.to, gap.from, gap.to - 1));
    }
    if (report.failed_pulls + report.failed_pushes > 0) {
      out.after.push_back(fmt::format("{} read(s) and {} push(es) failed because an owner was down",
                                      report.failed_pulls, report.failed_pushes));
    }
    out.model_to_save = report.owner_model;
    return out;
  }
  void stop() override { peer_.stop(); }

 private:
  PsPeer peer_;
};

}  // namespace

std::unique_ptr<run::TrainingRun> makePsRun(node::Node& node, run::NodeJob job,
                                            std::vector<NodeId> members, const PsOptions& options) {
  return std::make_unique<PsRun>(node, std::move(job), std::move(members), options);
}

}  // namespace chorus::ps
