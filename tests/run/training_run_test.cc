// The run layer both distributed modes share: option checks, shards, the common initial model,
// the batcher and the metrics path.
#include "run/training_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <set>

namespace chorus::run {
namespace {

std::shared_ptr<const ml::DataSplit> data() {
  static auto split = std::make_shared<const ml::DataSplit>(ml::makeSynthetic(500, 50, 3));
  return split;
}

RunOptions options() {
  RunOptions o;
  o.data.name = "synthetic";
  o.model.name = "softmax";
  o.rounds = 10;
  return o;
}

TEST(ShardSpec, ParsesIidAndDirichlet) {
  EXPECT_EQ(ShardSpec::parse("iid").kind, ShardSpec::Kind::kIid);
  ShardSpec d = ShardSpec::parse("dirichlet:0.5");
  EXPECT_EQ(d.kind, ShardSpec::Kind::kDirichlet);
  EXPECT_DOUBLE_EQ(d.alpha, 0.5);
  EXPECT_EQ(d.toString(), "dirichlet:0.5");
  for (const char* bad :
       {"", "dirichlet", "dirichlet:", "dirichlet:0", "dirichlet:-1", "dirichlet:1x", "skewed"}) {
    try {
      ShardSpec::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--shard"), std::string::npos) << e.what();
    }
  }
}

TEST(RunOptions, BadValuesNameTheFlag) {
  RunOptions o = options();
  o.stragglers = "sometimes:3";
  EXPECT_THROW(validateRunOptions(o), std::invalid_argument);
  o = options();
  o.rounds = 0;
  o.epochs = 0;
  EXPECT_THROW(validateRunOptions(o), std::invalid_argument);
  o = options();
  o.model.hidden = {10};
  try {
    validateRunOptions(o);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden"), std::string::npos);
  }
}

TEST(RunOptions, FlagsReachTheOptions) {
  CLI::App app;
  RunOptions p;
  addRunOptions(app, p);
  app.parse("--rounds 7 --shard dirichlet:0.3 --lr 0.1 --seed 9 --out d --hidden 8,4", false);
  EXPECT_EQ(p.rounds, 7);
  EXPECT_EQ(p.shard, "dirichlet:0.3");
  EXPECT_DOUBLE_EQ(p.lr, 0.1);
  EXPECT_EQ(p.seed, 9u);
  EXPECT_EQ(p.out_dir, "d");
  EXPECT_EQ(p.model.hidden, (std::vector<int>{8, 4}));
}

TEST(NodeJob, EveryNodeStartsFromTheSameModelOnItsOwnDisjointShard) {
  const int nodes = 4;
  std::set<size_t> seen;
  size_t total = 0;
  std::vector<float> first;
  for (int i = 0; i < nodes; ++i) {
    NodeJob job = prepareNodeJob(options(), data(), static_cast<uint32_t>(i), nodes, "");
    if (first.empty()) {
      first.assign(job.model->params().begin(), job.model->params().end());
    } else {
      EXPECT_TRUE(std::equal(first.begin(), first.end(), job.model->params().begin()));
    }
    total += job.shard.size();
    seen.insert(job.shard.begin(), job.shard.end());
    EXPECT_EQ(job.rounds, 10);
  }
  EXPECT_EQ(total, data()->train.size());
  EXPECT_EQ(seen.size(), data()->train.size());
}

TEST(NodeJob, RoundsFromEpochsOfAnAverageShardAndCombinedStragglers) {
  RunOptions o = options();
  o.rounds = 0;
  o.epochs = 2;
  o.batch = 10;
  o.stragglers = "fixed:5";
  NodeJob job = prepareNodeJob(o, data(), 1, 5, "slow:1=3");
  EXPECT_EQ(job.shard.size(), 100u);
  EXPECT_EQ(job.rounds, 20);
  EXPECT_EQ(job.stragglers.terms.size(), 2u);
  // Label-skewed shards differ in size, the rounds do not: every node runs the same number.
  o.shard = "dirichlet:0.3";
  std::set<size_t> sizes;
  for (uint32_t i = 0; i < 5; ++i) {
    NodeJob skewed = prepareNodeJob(o, data(), i, 5, "");
    sizes.insert(skewed.shard.size());
    EXPECT_EQ(skewed.rounds, 20);
  }
  EXPECT_GT(sizes.size(), 1u);
  o.shard = "iid";
  EXPECT_THROW(prepareNodeJob(o, data(), 5, 5, ""), std::invalid_argument);
  EXPECT_THROW(prepareNodeJob(o, data(), 1, 5, "bogus"), std::invalid_argument);
}

TEST(ShardBatcher, CyclesThroughTheShardEpochAfterEpoch) {
  std::vector<size_t> shard = {1, 3, 5, 7, 9};
  ShardBatcher batcher(data()->train, shard, 2, 4);
  EXPECT_EQ(batcher.batchesPerEpoch(), 3u);
  ml::Matrix batch;
  std::vector<int32_t> labels;
  size_t samples = 0;
  for (int i = 0; i < 6; ++i) {
    batcher.next(batch, labels);
    samples += labels.size();
    EXPECT_EQ(static_cast<size_t>(batch.cols()), labels.size());
  }
  EXPECT_EQ(samples, 10u);  // two whole epochs of 5
  EXPECT_EQ(batcher.epoch(), 2);
}

TEST(MetricsPath, OneFilePerNodeInACreatedFolder) {
  EXPECT_EQ(nodeMetricsPath("", 3), "");
  auto dir = std::filesystem::temp_directory_path() / ("run-test-" + std::to_string(getpid()));
  std::string path = nodeMetricsPath((dir / "sub").string(), 3);
  EXPECT_EQ(path, (dir / "sub" / "node-3.jsonl").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir / "sub"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::run
