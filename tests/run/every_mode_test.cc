// One suite for every training mode, as tensorpipe's TransportTest runs one suite against every
// transport: a local cluster of each mode (nodes as threads in this process, loopback, port 0,
// fixed seeds) trains synthetic data to a stated accuracy, finishes without a node killed
// mid-run, ends at once when stopped, and writes the metrics events every mode shares. A mode
// joins the suite with one line in kModes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "consensus/consensus_peer.h"
#include "ps/ps_peer.h"
#include "run/single_node.h"
#include "run/training_run.h"
#include "tests/ml/temp_dir.h"
#include "tests/support/local_cluster.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using testsupport::LocalCluster;
using testsupport::NodeId;

// Called on a node's trainer thread after each of its steps.
using StepHook = std::function<void(int64_t step)>;

// One mode as the suite runs it.
struct Mode {
  std::string name;  // the test names' suffix
  std::string mode;  // as the start event names it
  size_t nodes = 1;
  // Every node runs exactly --rounds steps (false: fully asynchronous PS, whose workers share
  // the cluster's clock budget).
  bool fixed_steps = true;
  // The mode's learning settings for the training scenario (its own tests' tuning).
  std::function<void(run::RunOptions&)> tune;
  // Puts the mode's peer running `job` on node `id` of `cluster`; `on_step` after every step.
  std::function<void(LocalCluster& cluster, NodeId id, run::NodeJob job, StepHook on_step)> attach;
};

// GoogleTest names a mode by its name (not its bytes) in test names and failures.
void PrintTo(const Mode& mode, std::ostream* out) {
  *out << mode.name;
}

// What the consensus tests train with: momentum on the local steps.
void consensusTuning(run::RunOptions& o) {
  o.lr = 0.05;
  o.momentum = 0.9;
  o.rounds = 400;
}

// What the PS tests train with: plain SGD at the owners, more clocks.
void psTuning(run::RunOptions& o) {
  o.lr = 0.1;
  o.momentum = 0;
  o.rounds = 800;
}

Mode single() {
  return {.name = "Single",
          .mode = "single",
          .nodes = 1,
          .tune = consensusTuning,
          .attach = [](LocalCluster& cluster, NodeId id, run::NodeJob job, StepHook on_step) {
            run::SingleOptions options;
            options.on_step_end = std::move(on_step);
            cluster.attach<testsupport::AlonePeer>(id, std::move(job), options);
          }};
}

// Consensus on `graph` with the default (dynamic) backup rule. Iteration skipping is off, so
// that every round has its event.
Mode consensusOn(std::string name, testsupport::Graph (*graph)(size_t)) {
  return {.name = std::move(name),
          .mode = "consensus",
          .nodes = 4,
          .tune = consensusTuning,
          .attach = [graph](LocalCluster& cluster, NodeId id, run::NodeJob job, StepHook on_step) {
            consensus::ConsensusOptions options;
            options.skip_gap = 0;
            options.on_round_end = [on_step](consensus::Round k) { on_step(k); };
            cluster.attach<consensus::ConsensusPeer>(
                id, std::move(job), testsupport::layoutOf(graph(cluster.size()), id), options);
          }};
}

// PS with staleness `bound` ("0": BSP, "inf": fully asynchronous).
Mode psWith(std::string name, std::string bound) {
  return {.name = std::move(name),
          .mode = "ps",
          .nodes = 4,
          .fixed_steps = bound != "inf",
          .tune = psTuning,
          .attach = [bound](LocalCluster& cluster, NodeId id, run::NodeJob job, StepHook on_step) {
            ps::PsOptions options;
            options.staleness = ps::Staleness::read(bound).value();
            options.key_floats = 1000;     // several keys per owner
            options.down_timeout_s = 0.3;  // a killed worker stops holding the owners quickly
            options.on_clock_end = [on_step](ps::Clock c, std::span<const float>) { on_step(c); };
            cluster.attach<ps::PsPeer>(id, std::move(job), testsupport::membersOf(cluster.size()),
                                       options);
          }};
}

// Every mode the suite runs; a new mode is one more line.
const Mode kModes[] = {
    single(),
    consensusOn("ConsensusRing", testsupport::ring),
    consensusOn("ConsensusStar", testsupport::star),
    psWith("PsBsp", "0"),
    psWith("PsSsp", "2"),
    psWith("PsAsync", "inf"),
};

class EveryMode : public ::testing::TestWithParam<Mode> {
 protected:
  const Mode& mode() const { return GetParam(); }
  size_t nodes() const { return mode().nodes; }

  // Puts the mode's peer on every node, each with its job of `options` on `data`; `on_step(id)`
  // gives node id's step hook (empty: none).
  void attachAll(LocalCluster& cluster, const run::RunOptions& options,
                 const std::shared_ptr<const ml::DataSplit>& data,
                 const std::function<StepHook(NodeId)>& on_step = {}) {
    for (NodeId id = 0; id < nodes(); ++id) {
      StepHook hook = on_step ? on_step(id) : StepHook{};
      mode().attach(
          cluster, id, run::prepareNodeJob(options, data, id, static_cast<int>(nodes())).value(),
          hook ? hook : [](int64_t) {});
    }
    cluster.connect();
  }

  // A short run of a softmax model on a little data, no evaluation before the end.
  static run::RunOptions shortRun(int64_t rounds) {
    run::RunOptions options;
    options.data.name = "synthetic";
    options.model.name = "softmax";
    options.lr = 0.05;
    options.batch = 32;
    options.rounds = rounds;
    options.eval_every = 0;
    options.seed = 3;
    return options;
  }

  testsupport::NodeSettings settings() const { return {.cluster = "every-mode-" + mode().name}; }
};

TEST_P(EveryMode, TrainsSyntheticDataToNinetyFivePercent) {
  run::RunOptions options = testsupport::syntheticTraining();
  mode().tune(options);
  LocalCluster cluster(nodes(), 0, settings());
  attachAll(cluster, options, testsupport::syntheticData(10000, 1000));
  cluster.start();
  for (size_t i = 0; i < nodes(); ++i) {
    const run::LoopReport r = cluster.loopResult(i);
    EXPECT_FALSE(r.stopped) << "node " << i;
    if (mode().fixed_steps) {
      EXPECT_EQ(r.steps_done, options.rounds) << "node " << i;
    }
    EXPECT_GE(r.final.accuracy, 0.95) << "node " << i;
    std::printf("node %zu: test accuracy %.4f after %lld steps\n", i, r.final.accuracy,
                static_cast<long long>(r.steps_done));
    EXPECT_TRUE(r.time_to_target.has_value()) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), nodes() - 1) << "node " << i;
    EXPECT_TRUE(r.departed_peers.empty()) << "node " << i;
  }
}

// The last node is killed for real at its step 5: its peer stops and its node closes every
// connection. The others run to the end, and each names it as departed.
TEST_P(EveryMode, AKilledNodeLeavesTheOthersFinishing) {
  if (nodes() < 2) GTEST_SKIP() << "one node alone: no other node to finish";
  const run::RunOptions options = shortRun(100);
  const NodeId victim = static_cast<NodeId>(nodes() - 1);
  LocalCluster cluster(nodes(), 0, settings());
  attachAll(cluster, options, testsupport::syntheticData(3000, 300), [&](NodeId id) -> StepHook {
    if (id != victim) return {};
    return [&cluster, victim, killed = std::make_shared<bool>(false)](int64_t step) {
      if (step >= 5 && !*killed) {
        *killed = true;
        cluster.kill(victim);
      }
    };
  });
  cluster.start();
  const run::LoopReport killed = cluster.loopResult(victim);
  EXPECT_TRUE(killed.stopped);
  EXPECT_LT(killed.steps_done, options.rounds);
  for (NodeId i = 0; i < victim; ++i) {
    const run::LoopReport r = cluster.loopResult(i);
    EXPECT_FALSE(r.stopped) << "node " << i;
    if (mode().fixed_steps) {
      EXPECT_EQ(r.steps_done, options.rounds) << "node " << i;
    } else {
      EXPECT_GT(r.steps_done, 0) << "node " << i;
    }
    EXPECT_EQ(r.departed_peers, std::vector<uint32_t>{victim}) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), nodes() - 2) << "node " << i;
  }
}

// A run of a million steps is stopped once node 0 is past its step 5: every node's run ends
// within 30 s (on loopback it takes milliseconds), as stopped, long before its last step.
TEST_P(EveryMode, StopMidRunEndsEveryNodePromptly) {
  const run::RunOptions options = shortRun(1'000'000);
  LocalCluster cluster(nodes(), 0, settings());
  std::promise<void> past_five;
  attachAll(cluster, options, testsupport::syntheticData(3000, 300), [&](NodeId id) -> StepHook {
    if (id != 0) return {};
    return [&past_five, fired = std::make_shared<bool>(false)](int64_t step) {
      if (step >= 5 && !*fired) {
        *fired = true;
        past_five.set_value();
      }
    };
  });
  cluster.start();
  ASSERT_EQ(past_five.get_future().wait_for(60s), std::future_status::ready)
      << "node 0 did not reach step 5 within 60 s";
  const auto stopped_at = std::chrono::steady_clock::now();
  cluster.stopAll();
  for (size_t i = 0; i < nodes(); ++i) {
    EXPECT_TRUE(cluster.finishedWithin(i, 30s)) << "node " << i << " still runs 30 s after stop()";
    const run::LoopReport r = cluster.loopResult(i);
    EXPECT_TRUE(r.stopped) << "node " << i;
    EXPECT_LT(r.steps_done, options.rounds) << "node " << i;
  }
  std::printf("every node ended %.3f s after stop()\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count());
}

// Every node's metrics file holds the events every mode writes: one start naming the mode, one
// event per step run, one final.
TEST_P(EveryMode, TheMetricsFileHasTheCommonEvents) {
  ml::testing::TempDir dir;
  run::RunOptions options = shortRun(30);
  options.eval_every = 10;
  options.out_dir = dir.path();
  LocalCluster cluster(nodes(), 0, settings());
  attachAll(cluster, options, testsupport::syntheticData(3000, 300));
  cluster.start();
  for (size_t i = 0; i < nodes(); ++i) {
    const run::LoopReport r = cluster.loopResult(i);
    const std::string path = dir.file("node-" + std::to_string(i) + ".jsonl");
    auto events = testsupport::countEvents(path);
    EXPECT_EQ(events["start"], 1u) << path;
    EXPECT_EQ(events[std::string(run::kStepName)], static_cast<size_t>(r.steps_done)) << path;
    EXPECT_EQ(events["final"], 1u) << path;
    if (mode().fixed_steps) {
      EXPECT_EQ(r.steps_done, options.rounds) << "node " << i;
    }
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    EXPECT_NE(first.find("\"event\":\"start\""), std::string::npos) << first;
    EXPECT_NE(first.find("\"mode\":\"" + mode().mode + "\""), std::string::npos) << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EveryMode, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace chorus
