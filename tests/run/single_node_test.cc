// End-to-end single-node training on synthetic data (the loop with no peers, behind chorus
// train and compare's single variant): learnability, determinism, evaluation, metrics,
// checkpoint save and resume.
#include "run/single_node.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "ml/checkpoint.h"
#include "ml/train.h"
#include "tests/ml/temp_dir.h"

namespace chorus::ml {
namespace {

// The options of a single-node run: chorus train's flags.
using TrainOptions = run::RunOptions;

// What a run achieved, as the tests look at it.
struct TrainReport {
  Evaluation test;
  std::vector<double> epochLosses;
  double epochsDone = 0;
};

// Trains `options` on `data` alone, as chorus train does: evaluation at every epoch's end.
TrainReport trainOnData(const TrainOptions& options, const DataSplit& data,
                        ProgressReporter& progress) {
  // The data outlives the run: a shared pointer that does not own it.
  std::shared_ptr<const DataSplit> shared(&data, [](const DataSplit*) {});
  node::Result<run::NodeJob> prepared = run::prepareNodeJob(options, shared, 0, 1);
  // A job that cannot be made (a --resume file refused) fails the run as chorus train does.
  if (!prepared.ok()) throw std::runtime_error("job refused: " + prepared.message());
  run::NodeJob& job = *prepared;
  run::SingleOptions single;
  single.eval_every_epoch = true;
  single.save_path = options.save_path;
  single.warmup_epochs = options.warmup_epochs;
  spdlog::logger log("single-node-test", std::make_shared<spdlog::sinks::null_sink_mt>());
  const run::SingleReport report = run::trainAlone(job, single, progress, log);
  return {report.final, report.epoch_losses, report.epochs_done};
}

class TrainingTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }
  // The metrics file of a run with --out `name`.
  std::string metrics(const std::string& name) const { return dir_.file(name + "/node-0.jsonl"); }

  static TrainOptions mlpOptions() {
    TrainOptions options;
    options.model = {.name = "mlp", .hidden = {64}};
    options.epochs = 3;
    options.batch = 32;
    options.lr = 0.05;
    options.momentum = 0.9;
    options.seed = 5;
    return options;
  }

  TrainReport run(const TrainOptions& options, const DataSplit& data) {
    std::FILE* sink = std::fopen("/dev/null", "w");
    ProgressReporter progress(sink, false);
    TrainReport report = trainOnData(options, data, progress);
    std::fclose(sink);
    return report;
  }

  // What a run prints on its progress reporter.
  static std::string printedBy(const TrainOptions& options, const DataSplit& data) {
    std::FILE* sink = std::tmpfile();
    EXPECT_NE(sink, nullptr);
    if (sink == nullptr) return {};
    ProgressReporter progress(sink, false);
    trainOnData(options, data, progress);
    std::rewind(sink);
    std::string printed;
    for (int c = std::fgetc(sink); c != EOF; c = std::fgetc(sink))
      printed += static_cast<char>(c);
    std::fclose(sink);
    return printed;
  }

  ml::testing::TempDir dir_;
};

const DataSplit& syntheticData() {
  static const DataSplit data = [] {
    DataSplit split = makeSynthetic(6000, 1000, 11);
    const ChannelStats stats = channelStats(split.train);
    normalize(split.train, stats);
    normalize(split.test, stats);
    return split;
  }();
  return data;
}

TEST_F(TrainingTest, MlpLearnsSyntheticDataToAtLeast95Percent) {
  const DataSplit& data = syntheticData();
  auto untrained = Model::create({.name = "mlp", .hidden = {64}, .input = data.train.shape}, 5);
  EXPECT_LT(evaluate(*untrained, data.test).accuracy, 0.3);
  const TrainReport report = run(mlpOptions(), data);
  EXPECT_GE(report.test.accuracy, 0.95);
  ASSERT_EQ(report.epochLosses.size(), 3u);
  EXPECT_LT(report.epochLosses.back(), report.epochLosses.front());
}

TEST_F(TrainingTest, SameSeedSameLossTrajectoryBitForBit) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 2;
  options.model.dropout = 0.2f;
  const TrainReport a = run(options, data);
  const TrainReport b = run(options, data);
  EXPECT_EQ(a.epochLosses, b.epochLosses);
  EXPECT_EQ(a.test.loss, b.test.loss);
  options.seed = 6;
  const TrainReport c = run(options, data);
  EXPECT_NE(a.epochLosses, c.epochLosses);
}

TEST_F(TrainingTest, LenetTrainsOnASmallSyntheticRun) {
  const DataSplit& data = syntheticData();
  TrainOptions options;
  options.model = {.name = "lenet", .hidden = {}};
  options.epochs = 1;
  options.batch = 32;
  options.lr = 0.005;
  options.train_limit = 1500;
  const TrainReport report = run(options, data);
  EXPECT_GE(report.test.accuracy, 0.8);
}

TEST_F(TrainingTest, MetricsAreJsonLinesWithOneEventPerLine) {
  TrainOptions options = mlpOptions();
  options.epochs = 1;
  options.out_dir = file("metrics");
  options.confusion = true;
  const TrainReport report = run(options, syntheticData());
  std::ifstream in(metrics("metrics"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  // start, one round event per step (6000 / 32 = 188 steps), final: the format of every mode.
  ASSERT_EQ(lines.size(), 190u);
  EXPECT_NE(lines[0].find("\"event\":\"start\""), std::string::npos);
  EXPECT_NE(lines[0].find("\"mode\":\"single\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"event\":\"step\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"loss\":"), std::string::npos);
  EXPECT_NE(lines[189].find("\"event\":\"final\""), std::string::npos);
  EXPECT_NE(lines[189].find("\"test_accuracy\":"), std::string::npos);
  EXPECT_NE(lines[189].find("\"confusion\":["), std::string::npos);
  for (const auto& line : lines) {
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
  }
  int64_t total = 0;
  for (int64_t count : report.test.confusion)
    total += count;
  EXPECT_EQ(total, 1000);
}

// The "step" events of a metrics file: step number (step + 1) -> field (loss, lr, ...).
std::map<int64_t, double> stepEvents(const std::string& path, const std::string& field) {
  std::map<int64_t, double> values;
  std::ifstream in(path);
  const std::string key = "\"" + field + "\":";
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"step\"") == std::string::npos) continue;
    const size_t step = line.find("\"step\":");
    const size_t value = line.find(key);
    if (step == std::string::npos || value == std::string::npos) continue;
    values[std::stoll(line.substr(step + 7)) + 1] = std::stod(line.substr(value + key.size()));
  }
  return values;
}

// Every step has its event, also across an epoch boundary, and an epoch's loss is the mean of
// its steps' losses.
TEST_F(TrainingTest, EveryStepHasItsEventAcrossEpochs) {
  TrainOptions options = mlpOptions();
  options.epochs = 2;
  options.train_limit = 96;  // three steps of 32 per epoch
  options.out_dir = file("every");
  const TrainReport report = run(options, syntheticData());
  const std::map<int64_t, double> each = stepEvents(metrics("every"), "loss");
  ASSERT_EQ(each.size(), 6u);
  ASSERT_EQ(report.epochLosses.size(), 2u);
  for (int64_t epoch : {0, 1}) {
    const int64_t first = 3 * epoch + 1;
    EXPECT_NEAR(report.epochLosses[static_cast<size_t>(epoch)],
                (each.at(first) + each.at(first + 1) + each.at(first + 2)) / 3.0, 1e-12)
        << epoch;
  }
}

// Schedule lengths shorter than a step round up to one step: --step-epochs 0.1 at three steps
// per epoch (0.3 steps) decays every step instead of never, and a warm-up that short is
// reported, since a warm-up of one step starts at the full rate.
TEST_F(TrainingTest, ScheduleLengthsUnderOneStepAreOneStep) {
  TrainOptions options = mlpOptions();
  options.epochs = 1;
  options.train_limit = 96;  // three steps of 32 per epoch
  options.schedule = "step";
  options.step_epochs = 0.1;
  options.gamma = 0.5;
  options.out_dir = file("lr");
  run(options, syntheticData());
  const std::map<int64_t, double> lr = stepEvents(metrics("lr"), "lr");
  ASSERT_EQ(lr.size(), 3u);
  EXPECT_DOUBLE_EQ(lr.at(1), 0.05);
  EXPECT_DOUBLE_EQ(lr.at(2), 0.025);
  EXPECT_DOUBLE_EQ(lr.at(3), 0.0125);

  options.schedule = "constant";
  // --step-epochs goes with --schedule step only (every command refuses it).
  options.step_epochs = 0;
  options.warmup_epochs = 0.1;
  const std::string printed = printedBy(options, syntheticData());
  EXPECT_NE(printed.find("--warmup-epochs 0.1"), std::string::npos) << printed;
  EXPECT_NE(printed.find("no effect"), std::string::npos) << printed;
}

TEST_F(TrainingTest, ResumingFromACheckpointContinuesExactly) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 3;
  const TrainReport straight = run(options, data);

  options.epochs = 2;
  options.save_path = file("run.ckpt");
  run(options, data);
  EXPECT_EQ(loadCheckpoint(options.save_path).epoch, 2);
  options.epochs = 3;
  options.save_path.clear();
  options.resume_path = file("run.ckpt");
  const TrainReport resumed = run(options, data);
  ASSERT_EQ(resumed.epochLosses.size(), 1u);
  EXPECT_EQ(resumed.epochLosses[0], straight.epochLosses[2]);
  EXPECT_EQ(resumed.test.loss, straight.test.loss);
  EXPECT_EQ(resumed.epochsDone, 3);
}

TEST_F(TrainingTest, ResumeRefusesACorruptOrForeignCheckpoint) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 1;
  options.save_path = file("a.ckpt");
  run(options, data);
  options.save_path.clear();
  options.resume_path = file("a.ckpt");
  options.model.hidden = {32};
  // The job is refused as a value naming the file (run::prepareNodeJob: kIo, exit 1).
  const auto refused = [&] {
    std::shared_ptr<const DataSplit> shared(&data, [](const DataSplit*) {});
    const node::Result<run::NodeJob> job = run::prepareNodeJob(options, shared, 0, 1);
    EXPECT_FALSE(job.ok());
    if (job.ok()) return;
    EXPECT_EQ(job.status().code(), node::ErrorCode::kIo);
    EXPECT_NE(job.message().find(options.resume_path), std::string::npos) << job.message();
  };
  refused();
  {
    std::fstream f(options.resume_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  options.model.hidden = {64};
  refused();
}

// The seed picks the shuffle order (and with --data synthetic the data itself): resuming with
// another one silently continued a different run. It is refused, naming both seeds.
TEST_F(TrainingTest, ResumeRefusesAnotherSeed) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 1;
  options.seed = 1;
  options.save_path = file("seed1.ckpt");
  run(options, data);
  options.save_path.clear();
  options.resume_path = file("seed1.ckpt");
  options.epochs = 2;
  options.seed = 7;
  try {
    run(options, data);
    ADD_FAILURE() << "resumed with another seed";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(options.resume_path), std::string::npos) << message;
    EXPECT_NE(message.find("written with --seed 1, this run uses --seed 7"), std::string::npos)
        << message;
    EXPECT_NE(message.find("pass --seed 1"), std::string::npos) << message;
  }
  options.seed = 1;
  EXPECT_EQ(run(options, data).epochsDone, 2);
}

// A checkpoint's velocity is of no use to a run with --momentum 0: the run says it drops it.
TEST_F(TrainingTest, ResumeWithoutMomentumSaysItDropsTheVelocity) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 1;
  options.save_path = file("momentum.ckpt");
  run(options, data);
  ASSERT_FALSE(loadCheckpoint(options.save_path).optimizerState.empty());
  options.save_path.clear();
  options.resume_path = file("momentum.ckpt");
  options.epochs = 2;
  options.momentum = 0.0;
  const std::string printed = printedBy(options, data);
  EXPECT_NE(printed.find("--momentum 0"), std::string::npos) << printed;
  EXPECT_NE(printed.find("velocity is dropped"), std::string::npos) << printed;
}

// The job is refused before training, as a kInvalidArgument value naming the flag.
TEST_F(TrainingTest, BadOptionsAreRejected) {
  const auto refused = [](const TrainOptions& options, const std::string& flag) {
    const DataSplit& data = syntheticData();
    std::shared_ptr<const DataSplit> shared(&data, [](const DataSplit*) {});
    const node::Result<run::NodeJob> job = run::prepareNodeJob(options, shared, 0, 1);
    ASSERT_FALSE(job.ok()) << flag;
    EXPECT_EQ(job.status().code(), node::ErrorCode::kInvalidArgument) << job.message();
    EXPECT_NE(job.message().find(flag), std::string::npos) << job.message();
  };
  TrainOptions options = mlpOptions();
  options.batch = 0;
  refused(options, "--batch");
  options = mlpOptions();
  options.schedule = "step";
  refused(options, "--step-epochs");
  options.schedule = "sawtooth";
  refused(options, "--schedule");
}

TEST_F(TrainingTest, SchedulesAndNesterovTrainToo) {
  const DataSplit& data = syntheticData();
  TrainOptions options = mlpOptions();
  options.epochs = 2;
  options.schedule = "cosine";
  options.warmup_epochs = 0.5;
  options.momentum = 0.9;
  options.nesterov = true;
  options.weight_decay = 1e-4;
  EXPECT_GE(run(options, data).test.accuracy, 0.9);
}

TEST(Evaluate, ConfusionMatrixCountsTruthAgainstPrediction) {
  auto model =
      Model::create({.name = "softmax", .hidden = {}, .input = {1, 1, 2}, .classes = 3}, 1);
  std::fill(model->params().begin(), model->params().end(), 0.0f);
  // Weights are 3x2 column-major: class c score = w(c,0)*x0 + w(c,1)*x1.
  auto p = model->params();
  p[0] = 1.0f;  // class 0 <- x0
  p[4] = 1.0f;  // class 1 <- x1
  Dataset data;
  data.shape = {1, 1, 2};
  data.classes = 3;
  data.features = {1, 0, 0, 1, 1, 0, 0, 1};
  data.labels = {0, 1, 2, 2};
  const Evaluation e = evaluate(*model, data, true, 3);
  EXPECT_DOUBLE_EQ(e.accuracy, 0.5);
  EXPECT_EQ(e.confusion, (std::vector<int64_t>{1, 0, 0, 0, 1, 0, 1, 1, 0}));
  EXPECT_NE(formatConfusion(e).find("rows: true label"), std::string::npos);
}

// Many nodes evaluate at once on one machine: the evaluation batch shrinks with the model's
// activations (cifar-cnn evaluates 64 samples at a time, not 1000), and the result does not
// depend on it.
TEST(Evaluate, TheBatchFollowsTheActivationsAndNotTheResult) {
  auto mlp = Model::create({.name = "mlp", .hidden = {}, .input = {1, 28, 28}, .classes = 10}, 1);
  auto cnn =
      Model::create({.name = "cifar-cnn", .hidden = {}, .input = {3, 32, 32}, .classes = 10}, 1);
  EXPECT_EQ(evaluationBatch(*mlp), 1000u);
  // Within the budget, or at the smallest batch when even that does not fit.
  const size_t cnn_batch = evaluationBatch(*cnn);
  EXPECT_GE(cnn_batch, 64u);
  EXPECT_LT(cnn_batch, 1000u);
  EXPECT_TRUE(cnn_batch == 64u ||
              cnn_batch * cnn->activationFloatsPerSample() * sizeof(float) <= size_t{16} << 20)
      << cnn_batch;
  EXPECT_GT(cnn->activationFloatsPerSample(), 32u * 32u * 32u);  // its first conv's output alone

  const DataSplit data = makeSynthetic(300, 700, 5);
  auto model = Model::create(
      {.name = "mlp", .hidden = {16}, .input = data.train.shape, .classes = data.train.classes}, 3);
  const Evaluation whole = evaluate(*model, data.test, true, 1000);
  const Evaluation small = evaluate(*model, data.test, true, 64);
  const Evaluation picked = evaluate(*model, data.test, true);
  EXPECT_EQ(small.confusion, whole.confusion);
  EXPECT_EQ(picked.confusion, whole.confusion);
  EXPECT_NEAR(small.loss, whole.loss, 1e-5);
  EXPECT_NEAR(picked.loss, whole.loss, 1e-5);
}

}  // namespace
}  // namespace chorus::ml
