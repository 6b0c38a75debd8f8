// The run layer both distributed modes share: option checks, shards, the common initial model,
// the batcher and the metrics path.
#include "run/training_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/ml/temp_dir.h"

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
  EXPECT_EQ(ShardSpec::read("iid")->kind, ShardSpec::Kind::kIid);
  const ShardSpec d = ShardSpec::read("dirichlet:0.5").value();
  EXPECT_EQ(d.kind, ShardSpec::Kind::kDirichlet);
  EXPECT_DOUBLE_EQ(d.alpha, 0.5);
  EXPECT_EQ(d.toString(), "dirichlet:0.5");
  for (const char* bad :
       {"", "dirichlet", "dirichlet:", "dirichlet:0", "dirichlet:-1", "dirichlet:1x", "skewed"}) {
    const auto read = ShardSpec::read(bad);
    EXPECT_FALSE(read.ok()) << "accepted '" << bad << "'";
    EXPECT_NE(read.message().find("--shard"), std::string::npos) << read.message();
  }
}

// An absurd alpha (1.7e308 parses as a finite number) is refused with the flag and the limit;
// 1e6 is already iid in effect.
TEST(ShardSpec, RefusesAnAlphaAboveAMillion) {
  EXPECT_DOUBLE_EQ(ShardSpec::read("dirichlet:1e6")->alpha, 1e6);
  for (const char* bad : {"dirichlet:1000001", "dirichlet:1.7e308", "dirichlet:inf"}) {
    const auto read = ShardSpec::read(bad);
    EXPECT_FALSE(read.ok()) << "accepted '" << bad << "'";
    const std::string& message = read.message();
    EXPECT_NE(message.find("--shard"), std::string::npos) << message;
    EXPECT_NE(message.find(bad), std::string::npos) << message;
    EXPECT_NE(message.find("1000000"), std::string::npos) << message;
  }
}

TEST(RunOptions, BadValuesNameTheFlag) {
  RunOptions o = options();
  // --stragglers is read where the flag enters: a bad profile never reaches the options.
  EXPECT_FALSE(faults::StragglerProfile::read("sometimes:3").ok());
  o.rounds = 0;
  o.epochs = 0;
  EXPECT_FALSE(checkRunOptions(o).ok());
  o = options();
  o.model.hidden = {10};
  const node::Status hidden = checkRunOptions(o);
  EXPECT_EQ(hidden.code(), node::ErrorCode::kInvalidArgument);
  EXPECT_NE(hidden.message().find("--hidden"), std::string::npos) << hidden.message();
}

// NaN compares false with every bound, so a check written as `x < 0 || x >= 1` lets it
// through: --momentum nan crashed a node and --target-acc nan reached a compare's manifest.
TEST(RunOptions, NotANumberIsRefusedNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::pair<std::string, void (*)(RunOptions&, double)>> fields = {
      {"--momentum", [](RunOptions& o, double v) { o.momentum = v; }},
      {"--weight-decay", [](RunOptions& o, double v) { o.weight_decay = v; }},
      {"--target-acc", [](RunOptions& o, double v) { o.target_acc = v; }},
      {"--step-epochs", [](RunOptions& o, double v) { o.step_epochs = v; }},
  };
  for (const auto& [flag, set] : fields) {
    RunOptions o = options();
    set(o, nan);
    const node::Status status = checkRunOptions(o);
    EXPECT_FALSE(status.ok()) << flag << " nan was accepted";
    EXPECT_NE(status.message().find(flag), std::string::npos) << status.message();
    // The same through the command line (CLI11's Range lets NaN pass).
    CLI::App app;
    RunOptions parsed = options();
    addRunOptions(app, parsed);
    try {
      app.parse(flag + " nan", false);
      const node::Status parsed_status = checkRunOptions(parsed);
      EXPECT_FALSE(parsed_status.ok()) << flag << " nan was accepted on the command line";
      EXPECT_NE(parsed_status.message().find(flag), std::string::npos) << parsed_status.message();
    } catch (const CLI::ParseError&) {
    }
  }
  RunOptions o = options();
  o.momentum = 0.9;
  o.weight_decay = 1e-3;
  o.target_acc = 1;
  EXPECT_TRUE(checkRunOptions(o).ok());
  o.momentum = 1;
  EXPECT_FALSE(checkRunOptions(o).ok());
}

// The typed flags are read where they enter; a bad value is CLI11's refusal naming the flag and
// what the grammar's reader said.
TEST(RunOptions, TypedFlagsAreReadOnceAndABadValueIsRefused) {
  CLI::App app;
  RunOptions p;
  addRunOptions(app, p);
  app.parse("--stragglers fixed:2+slow:1=3 --shard dirichlet:0.3", false);
  ASSERT_EQ(p.stragglers.terms.size(), 2u);
  EXPECT_EQ(p.stragglers.terms[1].factors.at(1), 3.0);
  EXPECT_EQ(p.stragglers.text, "fixed:2+slow:1=3");
  for (const std::string bad : {"--stragglers sometimes:3", "--shard skewed"}) {
    CLI::App again;
    RunOptions q;
    addRunOptions(again, q);
    try {
      again.parse(bad, false);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const CLI::ParseError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(bad.substr(0, bad.find(' '))), std::string::npos) << what;
      EXPECT_NE(what.find(bad.substr(bad.find(' ') + 1)), std::string::npos) << what;
    }
  }
}

TEST(RunOptions, FlagsReachTheOptions) {
  CLI::App app;
  RunOptions p;
  addRunOptions(app, p);
  app.parse("--rounds 7 --shard dirichlet:0.3 --lr 0.1 --seed 9 --out d --hidden 8,4", false);
  EXPECT_EQ(p.rounds, 7);
  EXPECT_EQ(p.shard.toString(), "dirichlet:0.3");
  EXPECT_DOUBLE_EQ(p.lr, 0.1);
  EXPECT_EQ(p.seed, 9u);
  EXPECT_EQ(p.out_dir, "d");
  EXPECT_EQ(p.model.hidden, (std::vector<int>{8, 4}));
}

TEST(RunOptions, ScheduleAndAugmentationFlags) {
  CLI::App app;
  RunOptions p;
  addRunOptions(app, p);
  app.parse(
      "--schedule step --step-epochs 2 --gamma 0.5 --warmup-epochs 0.5 --augment "
      "--crop-padding 2 --no-flip",
      false);
  EXPECT_EQ(p.schedule, "step");
  EXPECT_DOUBLE_EQ(p.step_epochs, 2);
  EXPECT_DOUBLE_EQ(p.gamma, 0.5);
  EXPECT_DOUBLE_EQ(p.warmup_epochs, 0.5);
  EXPECT_TRUE(p.augment);
  EXPECT_EQ(p.crop_padding, 2);
  EXPECT_FALSE(p.flip);
  EXPECT_TRUE(checkRunOptions(options()).ok());

  auto message = [](const RunOptions& o) { return checkRunOptions(o).message(); };
  RunOptions o = options();
  o.schedule = "step";  // without --step-epochs it would never decay
  EXPECT_NE(message(o).find("--step-epochs"), std::string::npos) << message(o);
  o = options();
  o.step_epochs = 3;  // with the constant schedule it would be ignored
  EXPECT_NE(message(o).find("--step-epochs"), std::string::npos) << message(o);
  o = options();
  o.schedule = "linear";
  EXPECT_NE(message(o).find("unknown learning-rate schedule 'linear'"), std::string::npos)
      << message(o);
}

// The schedule runs over rounds, with epochs counted like --epochs (an average shard).
TEST(NodeJob, TheScheduleIsInRoundsOfAnAverageShard) {
  RunOptions o = options();
  o.rounds = 0;
  o.epochs = 4;
  o.batch = 10;  // 500 samples / 5 nodes = 100 per shard: 10 rounds per epoch
  o.lr = 0.2;
  o.schedule = "step";
  o.step_epochs = 1.5;
  o.gamma = 0.5;
  o.warmup_epochs = 0.5;
  NodeJob job = prepareNodeJob(o, data(), 0, 5).value();
  EXPECT_EQ(job.rounds, 40);
  EXPECT_EQ(job.schedule.warmupSteps, 5);
  EXPECT_EQ(job.schedule.stepEvery, 15);
  EXPECT_DOUBLE_EQ(job.schedule.at(0), 0.2 / 5);
  EXPECT_DOUBLE_EQ(job.schedule.at(5), 0.2);
  EXPECT_DOUBLE_EQ(job.schedule.at(5 + 15), 0.1);
  // Lengths under one round are one round, as in chorus train.
  o.step_epochs = 0.04;
  o.warmup_epochs = 0.04;
  job = prepareNodeJob(o, data(), 0, 5).value();
  EXPECT_EQ(job.schedule.warmupSteps, 1);
  EXPECT_EQ(job.schedule.stepEvery, 1);
  o.schedule = "cosine";
  o.step_epochs = 0;
  o.warmup_epochs = 0;
  job = prepareNodeJob(o, data(), 0, 5).value();
  EXPECT_EQ(job.schedule.totalSteps, 40);
  EXPECT_DOUBLE_EQ(job.schedule.at(0), 0.2);
  EXPECT_NEAR(job.schedule.at(20), 0.1, 1e-12);
  EXPECT_NEAR(job.schedule.at(40), 0.0, 1e-12);
  EXPECT_FALSE(job.augmentation.enabled);
}

// A tiny image data set: 4x4 single-channel images whose pixels are their index + 1, so a
// crop or a flip always changes what the batch holds.
std::shared_ptr<const ml::DataSplit> images() {
  auto split = std::make_shared<ml::DataSplit>();
  for (ml::Dataset* d : {&split->train, &split->test}) {
    d->name = "tiny-images";
    d->shape = {1, 4, 4};
    for (int s = 0; s < 40; ++s) {
      for (int i = 0; i < 16; ++i)
        d->features.push_back(static_cast<float>(i + 1));
      d->labels.push_back(s % 10);
    }
  }
  return split;
}

TEST(NodeJob, AugmentationReachesTheBatcher) {
  RunOptions o = options();
  o.augment = true;
  o.model.name = "mlp";
  o.crop_padding = 1;
  const auto split = images();
  NodeJob job = prepareNodeJob(o, split, 0, 2).value();
  ASSERT_TRUE(job.augmentation.enabled);
  EXPECT_EQ(job.augmentation.padding, 1);
  ShardBatcher plain(split->train, job.shard, 20, 7);
  ShardBatcher augmented(split->train, job.shard, 20, 7, job.augmentation);
  ShardBatcher again(split->train, job.shard, 20, 7, job.augmentation);
  ml::Matrix a, b, c;
  std::vector<int32_t> la, lb, lc;
  plain.next(a, la);
  augmented.next(b, lb);
  again.next(c, lc);
  EXPECT_EQ(la, lb);            // the same samples, in the same order
  EXPECT_FALSE(a.isApprox(b));  // but cropped or mirrored
  EXPECT_TRUE(b.isApprox(c));   // and reproducibly so from the seed
}

// A resumed run skips the batches it already trained on; the batches after them must be the
// ones an uninterrupted run draws, crops and flips included.
TEST(NodeJob, SkippingBatchesKeepsTheAugmentationOfTheBatchesAfterThem) {
  RunOptions o = options();
  o.augment = true;
  o.model.name = "mlp";
  o.crop_padding = 2;
  const auto split = images();
  NodeJob job = prepareNodeJob(o, split, 0, 2).value();
  ASSERT_TRUE(job.augmentation.enabled);
  ShardBatcher uninterrupted(split->train, job.shard, 7, 3, job.augmentation);
  ShardBatcher resumed(split->train, job.shard, 7, 3, job.augmentation);
  const size_t skipped = uninterrupted.batchesPerEpoch() + 2;  // into the second epoch
  ml::Matrix a, b;
  std::vector<int32_t> la, lb;
  for (size_t i = 0; i < skipped; ++i)
    uninterrupted.next(a, la);
  resumed.skip(skipped);
  for (int i = 0; i < 3; ++i) {
    uninterrupted.next(a, la);
    resumed.next(b, lb);
    EXPECT_EQ(la, lb);
    EXPECT_TRUE(a == b) << "batch " << i << " after the skip differs";
  }
}

TEST(NodeJob, EveryNodeStartsFromTheSameModelOnItsOwnDisjointShard) {
  const int nodes = 4;
  std::set<size_t> seen;
  size_t total = 0;
  std::vector<float> first;
  for (int i = 0; i < nodes; ++i) {
    NodeJob job = prepareNodeJob(options(), data(), static_cast<uint32_t>(i), nodes).value();
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

// A node process keeps only its shard in memory, and draws exactly the batches it drew from
// the whole training set.
TEST(NodeJob, ANodeProcessKeepsItsShardAndDrawsEveryBatch) {
  NodeJob full = prepareNodeJob(options(), data(), 1, 3).value();
  NodeJob compact = prepareNodeProcessJob(options(), *data(), 1, 3).value();
  ASSERT_EQ(compact.shard.size(), full.shard.size());
  EXPECT_EQ(compact.data->train.size(), full.shard.size());
  EXPECT_EQ(compact.data->train.dim(), data()->train.dim());
  EXPECT_EQ(compact.data->test.features, data()->test.features);
  EXPECT_EQ(compact.data->test.labels, data()->test.labels);
  EXPECT_EQ(compact.rounds, full.rounds);
  EXPECT_TRUE(std::equal(full.model->params().begin(), full.model->params().end(),
                         compact.model->params().begin()));
  ShardBatcher before(full.data->train, full.shard, 16, 5);
  ShardBatcher after(compact.data->train, compact.shard, 16, 5);
  ml::Matrix a, b;
  std::vector<int32_t> la, lb;
  // Three epochs and then some: the shuffle of every epoch must agree too.
  for (size_t i = 0; i < 3 * before.batchesPerEpoch() + 2; ++i) {
    before.next(a, la);
    after.next(b, lb);
    ASSERT_EQ(la, lb) << "batch " << i;
    ASSERT_TRUE(a == b) << "batch " << i;
  }
}

// An MNIST-shaped folder (IDX files, 6x6 images) whose samples differ from each other.
void writeSmallMnist(const std::string& folder, uint32_t train, uint32_t test) {
  auto be32 = [](std::string& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>(v >> shift));
  };
  auto write = [&](const std::string& name, uint32_t count) {
    std::string images, labels;
    be32(images, 0x00000803);
    be32(images, count);
    be32(images, 6);
    be32(images, 6);
    be32(labels, 0x00000801);
    be32(labels, count);
    for (uint32_t i = 0; i < count; ++i) {
      for (uint32_t p = 0; p < 36; ++p)
        images.push_back(static_cast<char>((i * 37 + p * 11) % 256));
      labels.push_back(static_cast<char>((i * 7 + i / 10) % 10));
    }
    std::ofstream(folder + "/" + name + "-images-idx3-ubyte", std::ios::binary) << images;
    std::ofstream(folder + "/" + name + "-labels-idx1-ubyte", std::ios::binary) << labels;
  };
  write("train", train);
  write("t10k", test);
}

// A node process that streams only its own samples from the files gets the job of a process
// that loaded everything and kept its shard: the same samples in the same order, the same test
// set, model and rounds, for iid and Dirichlet shards and with --limit.
TEST(NodeJob, ANodeProcessReadingOnlyItsShardGetsTheSameJob) {
  ml::testing::TempDir dir;
  writeSmallMnist(dir.path(), 240, 30);
  struct Case {
    std::string data, shard;
    size_t limit;
    uint32_t node;
    int nodes;
  };
  for (const Case& c : {Case{"mnist", "iid", 0, 1, 3}, Case{"mnist", "dirichlet:0.5", 0, 2, 4},
                        Case{"mnist", "iid", 150, 0, 2}, Case{"synthetic", "iid", 0, 2, 3}}) {
    SCOPED_TRACE(c.data + " " + c.shard + " limit " + std::to_string(c.limit));
    RunOptions o = options();
    o.data.name = c.data;
    o.data.dataDir = c.data == "synthetic" ? "" : dir.path();
    o.data.syntheticTrain = 300;
    o.shard = ShardSpec::read(c.shard).value();
    o.train_limit = c.limit;
    o.rounds = 0;
    o.epochs = 2;
    NodeJob loaded = prepareNodeProcessJob(o, loadRunSplit(o).value(), c.node, c.nodes).value();
    NodeJob streamed = loadNodeProcessJob(o, c.node, c.nodes).value();
    EXPECT_EQ(streamed.shard, loaded.shard);
    EXPECT_EQ(streamed.data->train.shape, loaded.data->train.shape);
    EXPECT_EQ(streamed.data->train.labels, loaded.data->train.labels);
    EXPECT_EQ(streamed.data->train.features, loaded.data->train.features);
    EXPECT_EQ(streamed.data->test.features, loaded.data->test.features);
    EXPECT_EQ(streamed.data->test.labels, loaded.data->test.labels);
    EXPECT_EQ(streamed.rounds, loaded.rounds);
    EXPECT_TRUE(std::equal(loaded.model->params().begin(), loaded.model->params().end(),
                           streamed.model->params().begin()));
  }
}

TEST(NodeJob, ASingleNodeProcessKeepsTheWholeTrainingSet) {
  NodeJob job = prepareNodeProcessJob(options(), *data(), 0, 1).value();
  EXPECT_EQ(job.data->train.size(), data()->train.size());
  EXPECT_EQ(job.data->test.labels, data()->test.labels);
  EXPECT_EQ(job.shard.size(), data()->train.size());
}

TEST(NodeJob, RoundsFromEpochsOfAnAverageShardAndCombinedStragglers) {
  RunOptions o = options();
  o.rounds = 0;
  o.epochs = 2;
  o.batch = 10;
  o.stragglers = chorus::faults::StragglerProfile::read("fixed:5").value();
  NodeJob job =
      prepareNodeJob(o, data(), 1, 5, faults::StragglerProfile::read("slow:1=3").value()).value();
  EXPECT_EQ(job.shard.size(), 100u);
  EXPECT_EQ(job.rounds, 20);
  EXPECT_EQ(job.stragglers.terms.size(), 2u);
  // Label-skewed shards differ in size, the rounds do not: every node runs the same number.
  o.shard = ShardSpec::read("dirichlet:0.3").value();
  std::set<size_t> sizes;
  for (uint32_t i = 0; i < 5; ++i) {
    NodeJob skewed = prepareNodeJob(o, data(), i, 5).value();
    sizes.insert(skewed.shard.size());
    EXPECT_EQ(skewed.rounds, 20);
  }
  EXPECT_GT(sizes.size(), 1u);
  o.shard = ShardSpec::read("iid").value();
  const node::Result<NodeJob> outside = prepareNodeJob(o, data(), 5, 5);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), node::ErrorCode::kInvalidArgument);
  EXPECT_EQ(outside.message(), "node 5 is not one of 5 nodes");
  // The flag's profile and the node's attribute, each good alone, give node 1 two crash steps.
  o.stragglers = faults::StragglerProfile::read("crash:1@5").value();
  const node::Result<NodeJob> crashes =
      prepareNodeJob(o, data(), 1, 5, faults::StragglerProfile::read("crash:1@9").value());
  ASSERT_FALSE(crashes.ok());
  EXPECT_EQ(crashes.status().code(), node::ErrorCode::kInvalidArgument);
}

// The loaders' failures are values naming what to fix: an empty shard names the node and --shard,
// a bad option its flag, an unusable --resume file the file (kIo: the run fails, exit 1), a data
// folder without the files the data set's name.
TEST(NodeJob, UnusableInputIsAnErrorValueNamingIt) {
  RunOptions o = options();
  o.train_limit = 3;
  const node::Result<NodeJob> empty = prepareNodeJob(o, data(), 4, 5);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), node::ErrorCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("node 4 got no training samples"), std::string::npos)
      << empty.message();
  EXPECT_NE(empty.message().find("--shard iid"), std::string::npos) << empty.message();

  o = options();
  o.batch = 0;
  EXPECT_EQ(loadNodeProcessJob(o, 0, 1).message(), "--batch must be > 0");

  o = options();
  const auto dir =
      std::filesystem::temp_directory_path() / ("run-test-resume-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string bogus = (dir / "model.ckpt").string();
  { std::ofstream(bogus) << "not a checkpoint"; }
  o.resume_path = bogus;
  const node::Result<NodeJob> resumed = prepareNodeJob(o, data(), 0, 1);
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.status().code(), node::ErrorCode::kIo);
  EXPECT_NE(resumed.message().find(bogus), std::string::npos) << resumed.message();

  o = options();
  o.data.name = "mnist";
  o.data.dataDir = dir.string();  // holds no MNIST files
  const node::Result<ml::DataSplit> missing = loadRunSplit(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), node::ErrorCode::kIo);
  EXPECT_NE(missing.message().find("mnist"), std::string::npos) << missing.message();
  EXPECT_FALSE(loadNodeProcessJob(o, 0, 1).ok());
  std::filesystem::remove_all(dir);
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
  EXPECT_EQ(nodeMetricsPath("", 3).value(), "");
  auto dir = std::filesystem::temp_directory_path() / ("run-test-" + std::to_string(getpid()));
  std::string path = nodeMetricsPath((dir / "sub").string(), 3).value();
  EXPECT_EQ(path, (dir / "sub" / "node-3.jsonl").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir / "sub"));
  // A folder that cannot be made (a file is in the way) is an I/O error naming --out.
  { std::ofstream(dir / "file") << "x"; }
  const node::Result<std::string> blocked = nodeMetricsPath((dir / "file" / "sub").string(), 3);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), node::ErrorCode::kIo);
  EXPECT_NE(blocked.message().find("--out " + (dir / "file" / "sub").string()), std::string::npos)
      << blocked.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::run
