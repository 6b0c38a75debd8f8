#include "consensus/consensus_session.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace chorus::consensus {
namespace {

class ConsensusRun : public run::TrainingRun {
 public:
  ConsensusRun(node::Node& node, run::NodeJob job, const PeerLayout& layout,
               const ConsensusOptions& options)
      : peer_(node, std::move(job), layout, options) {}

  run::TrainingOutcome run() override {
    const ConsensusReport report = peer_.run();
    run::TrainingOutcome out;
    out.steps = "rounds";
    out.loop = report;
    if (report.average_accuracy) {
      out.after.push_back(fmt::format("test accuracy of the average of {} final models: {:.2f}%",
                                      report.averaged_models, 100 * *report.average_accuracy));
    }
    out.model_to_save = report.final_model;
    // Its model never reached node 0's average: a failed run (exit 1), said once.
    if (report.cut_off) throw std::runtime_error(*report.cut_off);
    return out;
  }
  void stop() override { peer_.stop(); }

 private:
  ConsensusPeer peer_;
};

}  // namespace

std::unique_ptr<run::TrainingRun> makeConsensusRun(node::Node& node, run::NodeJob job,
                                                   const PeerLayout& layout,
                                                   const ConsensusOptions& options) {
  return std::make_unique<ConsensusRun>(node, std::move(job), layout, options);
}

}  // namespace chorus::consensus
