// KGE training end to end on small generated graphs: a few epochs reach a stated filtered MRR,
// the driver's checkpoints resume bit-identically, and its metrics file has the usual events.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "ml/checkpoint.h"
#include "ml/dataset.h"
#include "ml/kge_workload.h"
#include "ml/triples.h"

namespace chorus::ml {
namespace {

// A graph with structure to learn: 120 entities in 12 groups of 10; relation r links every
// entity of group g to every entity of group (g + r + 1) mod 12, so relations are not symmetric
// and no relation is its own inverse (ComplEx can model that, DistMult cannot: its score is
// symmetric in head and tail). With `symmetric`, r links group g to g XOR (r + 1), a pairing
// of the groups, which DistMult can model. 120 x 3 x 10 = 3600 facts, shuffled, 10% each held out
// for valid and test. A held-out fact's filtered rank is 1 when the model ranks the right group
// above the others (the other members of the group are known facts and filtered); a model that
// learned nothing scores MRR about 0.04.
KgData groupGraph(uint64_t seed, bool symmetric = false) {
  constexpr uint32_t kGroups = 12, kPerGroup = 10, kRelations = 3;
  KgData data;
  data.name = "groups";
  for (uint32_t e = 0; e < kGroups * kPerGroup; ++e)
    data.entityNames.push_back("e" + std::to_string(e));
  for (uint32_t r = 0; r < kRelations; ++r)
    data.relationNames.push_back("r" + std::to_string(r));
  std::vector<Triple> facts;
  for (uint32_t h = 0; h < kGroups * kPerGroup; ++h) {
    for (uint32_t r = 0; r < kRelations; ++r) {
      const uint32_t group = h / kPerGroup;
      const uint32_t target = symmetric ? group ^ (r + 1) : (group + r + 1) % kGroups;
      for (uint32_t i = 0; i < kPerGroup; ++i)
        facts.push_back({h, r, target * kPerGroup + i});
    }
  }
  Rng rng(seed);
  rng.shuffle(facts.begin(), facts.end());
  const size_t held = facts.size() / 10;
  data.valid.assign(facts.begin(), facts.begin() + static_cast<std::ptrdiff_t>(held));
  data.test.assign(facts.begin() + static_cast<std::ptrdiff_t>(held),
                   facts.begin() + static_cast<std::ptrdiff_t>(2 * held));
  data.train.assign(facts.begin() + static_cast<std::ptrdiff_t>(2 * held), facts.end());
  return data;
}

ProgressReporter quietProgress() {
  static std::FILE* null = std::fopen("/dev/null", "w");
  return ProgressReporter(null, false);
}

struct TrainCase {
  const char* name;
  KgeModelKind model;
  bool all;
  KgeLossKind loss;
  double temperature;
  bool symmetricGraph;
  bool reciprocal = false;
  bool shared = false;
};

class KgeTrainingTest : public ::testing::TestWithParam<TrainCase> {};

// Four epochs reach MRR >= 0.8 on held-out facts (measured: 1.000 for each case; a model that
// learned nothing gets about 0.04, so the bar cannot be met by chance).
TEST_P(KgeTrainingTest, AFewEpochsOnAGeneratedGraphReachTheStatedMrr) {
  const TrainCase c = GetParam();
  const KgData data = groupGraph(5, c.symmetricGraph);
  KgeConfig config;
  config.model = c.model;
  config.dim = 16;
  config.negatives = 16;
  config.allNegatives = c.all;
  config.reciprocal = c.reciprocal;
  config.sharedNegatives = c.shared;
  config.loss = c.loss;
  config.adversarialTemperature = c.temperature;
  config.regularizer = KgeRegularizerKind::kN3;
  config.regWeight = 1e-3;
  config.initScale = 0.1;
  KgeWorkload workload(data, config, 3);
  const double before = workload.rank("test").mrr;
  EXPECT_LT(before, 0.2);
  SparseTrainOptions options;
  options.epochs = 4;
  options.batchSize = 64;
  options.optimizer.lr = 0.1;
  options.evalEvery = 0;
  auto progress = quietProgress();
  const SparseTrainReport report = trainSparse(workload, options, progress);
  ASSERT_EQ(report.final.size(), 2u);
  EXPECT_EQ(report.final[1].first, "test");
  const double mrr = report.final[1].second[0].value;
  EXPECT_GE(mrr, 0.8) << c.name;
  std::printf("%s: test MRR %.3f before, %.3f after %lld epochs\n", c.name, before, mrr,
              static_cast<long long>(report.epochsDone));
  EXPECT_LT(report.epochLosses.back(), report.epochLosses.front()) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, KgeTrainingTest,
    ::testing::Values(TrainCase{"ComplExLogistic", KgeModelKind::kComplEx, false,
                                KgeLossKind::kLogistic, 0.0, false},
                      TrainCase{"ComplExSelfAdversarial", KgeModelKind::kComplEx, false,
                                KgeLossKind::kLogistic, 1.0, false},
                      TrainCase{"ComplExAllEntitiesCe", KgeModelKind::kComplEx, true,
                                KgeLossKind::kCrossEntropy, 0.0, false},
                      TrainCase{"DistMultSampledCeSymmetricGraph", KgeModelKind::kDistMult, false,
                                KgeLossKind::kCrossEntropy, 0.0, true},
                      TrainCase{"DistMultAllEntitiesLogisticSymmetricGraph",
                                KgeModelKind::kDistMult, true, KgeLossKind::kLogistic, 0.0, true},
                      TrainCase{"ComplExReciprocalAllEntitiesCe", KgeModelKind::kComplEx, true,
                                KgeLossKind::kCrossEntropy, 0.0, false, true},
                      TrainCase{"DistMultReciprocalSampledCeSymmetricGraph",
                                KgeModelKind::kDistMult, false, KgeLossKind::kCrossEntropy, 0.0,
                                true, true},
                      TrainCase{"ComplExReciprocalSharedCe", KgeModelKind::kComplEx, false,
                                KgeLossKind::kCrossEntropy, 0.0, false, true, true},
                      TrainCase{"DistMultSharedLogisticSymmetricGraph", KgeModelKind::kDistMult,
                                false, KgeLossKind::kLogistic, 0.0, true, false, true}),
    [](const ::testing::TestParamInfo<TrainCase>& info) { return std::string(info.param.name); });

// Three epochs straight, against one epoch, a checkpoint, and two more from it: the same bits
// (tables, AdaGrad state), because the shuffle and the negatives of epoch e depend only on the
// seed and e.
TEST(SparseTrain, ResumingFromACheckpointIsBitIdentical) {
  const KgData data = groupGraph(2);
  KgeConfig config;
  config.dim = 8;
  config.negatives = 4;
  config.initScale = 0.1;
  const std::string path =
      (std::filesystem::temp_directory_path() / "chorus_sparse_resume.ckpt").string();
  SparseTrainOptions options;
  options.batchSize = 50;
  options.evalEvery = 0;
  options.seed = 9;
  auto progress = quietProgress();

  KgeWorkload straight(data, config, 1);
  options.epochs = 3;
  trainSparse(straight, options, progress);

  KgeWorkload first(data, config, 1);
  options.epochs = 1;
  options.savePath = path;
  trainSparse(first, options, progress);
  KgeWorkload resumed(data, config, 1);
  options.epochs = 3;
  options.savePath.clear();
  options.resumePath = path;
  const SparseTrainReport report = trainSparse(resumed, options, progress);
  EXPECT_EQ(report.epochsDone, 3);
  EXPECT_EQ(report.epochLosses.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    const auto a = straight.tables()[t]->values(), b = resumed.tables()[t]->values();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "table " << t;
  }
  // Another seed, or another optimizer (AdaGrad state against none), is refused.
  KgeWorkload other(data, config, 1);
  options.seed = 10;
  EXPECT_THROW(trainSparse(other, options, progress), CheckpointError);
  options.seed = 9;
  options.optimizer.kind = SparseOptimizerKind::kSgd;
  EXPECT_THROW(trainSparse(other, options, progress), CheckpointError);
  std::filesystem::remove(path);
}

TEST(SparseTrain, MetricsFileHasStartEpochAndSummaryEvents) {
  const KgData data = groupGraph(2);
  KgeConfig config;
  config.dim = 8;
  config.negatives = 4;
  const std::string path =
      (std::filesystem::temp_directory_path() / "chorus_sparse_metrics.jsonl").string();
  SparseTrainOptions options;
  options.epochs = 2;
  options.batchSize = 100;
  options.logEverySteps = 10;
  options.metricsPath = path;
  KgeWorkload workload(data, config, 1);
  auto progress = quietProgress();
  trainSparse(workload, options, progress);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_NE(lines.front().find("\"event\":\"start\""), std::string::npos);
  EXPECT_NE(lines.front().find("\"model\":\"complex dim=8 entities=120 relations=3\""),
            std::string::npos);
  size_t epochs = 0, steps = 0;
  for (const auto& line : lines) {
    epochs += line.find("\"event\":\"epoch\"") != std::string::npos;
    steps += line.find("\"event\":\"step\"") != std::string::npos;
  }
  EXPECT_EQ(epochs, 2u);
  EXPECT_EQ(steps, 5u);  // 29 steps per epoch: events at steps 10, 20, 30, 40, 50
  // Epoch 1 evaluates valid (--eval-every 1); the last epoch leaves it to the summary.
  EXPECT_NE(lines[3].find("valid_mrr"), std::string::npos);
  EXPECT_NE(lines.back().find("\"test_mrr\""), std::string::npos);
  EXPECT_NE(lines.back().find("\"valid_hits@10\""), std::string::npos);
  std::filesystem::remove(path);
}

// A one-parameter workload whose quality is scripted per epoch: SGD with lr 1 and gradient -1
// adds 1 to the parameter each epoch (one step per epoch), and the quality of parameter value v
// is kQuality[v].
class ScriptedWorkload : public SparseWorkload {
 public:
  static constexpr double kQuality[] = {0.0, 0.3, 0.5, 0.4, 0.45};
  ScriptedWorkload() : table_("w", 1, 1) {}
  std::string spec() const override { return "scripted"; }
  std::vector<SparseTable*> tables() override { return {&table_}; }
  size_t trainPoints() const override { return 1; }
  double computeGradients(std::span<const size_t>, Rng&,
                          std::span<SparseGradAccumulator> grads) override {
    grads[0].row(0)[0] = -1.0f;
    return 1.0;
  }
  std::vector<std::string> evalSplits() const override { return {"valid", "test"}; }
  std::vector<NamedMetric> evaluate(const std::string& split) override {
    const auto v = static_cast<size_t>(table_.row(0)[0] + 0.5f);
    return {{"quality", kQuality[v] + (split == "test" ? 0.01 : 0.0)}};
  }
  bool higherIsBetter() const override { return true; }

 private:
  SparseTable table_;
};

// --keep-best evaluates the tables of the epoch best on valid (2 of 4), not the last epoch's;
// without it, the last epoch's; and a last epoch that is the best is evaluated as itself.
TEST(SparseTrain, KeepBestEvaluatesTheEpochBestOnValid) {
  auto progress = quietProgress();
  SparseTrainOptions options;
  options.epochs = 4;
  options.batchSize = 1;
  options.optimizer.kind = SparseOptimizerKind::kSgd;
  options.optimizer.lr = 1.0;
  options.keepBest = true;
  ScriptedWorkload best;
  const SparseTrainReport kept = trainSparse(best, options, progress);
  EXPECT_EQ(kept.epochsDone, 4);
  EXPECT_EQ(kept.evaluatedEpoch, 2);
  EXPECT_DOUBLE_EQ(kept.final[0].second[0].value, 0.5);
  EXPECT_DOUBLE_EQ(kept.final[1].second[0].value, 0.51);
  options.keepBest = false;
  ScriptedWorkload last;
  const SparseTrainReport plain = trainSparse(last, options, progress);
  EXPECT_EQ(plain.evaluatedEpoch, 4);
  EXPECT_DOUBLE_EQ(plain.final[1].second[0].value, 0.46);
  options.keepBest = true;
  options.epochs = 2;
  ScriptedWorkload rising;
  const SparseTrainReport lastIsBest = trainSparse(rising, options, progress);
  EXPECT_EQ(lastIsBest.evaluatedEpoch, 2);
  EXPECT_DOUBLE_EQ(lastIsBest.final[0].second[0].value, 0.5);
}

TEST(SparseTrain, BadOptionsNameTheirFlag) {
  const KgData data = groupGraph(2);
  KgeWorkload workload(data, KgeConfig{.dim = 8}, 1);
  auto progress = quietProgress();
  auto message = [&](SparseTrainOptions options) {
    try {
      trainSparse(workload, options, progress);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SparseTrainOptions o;
  o.batchSize = 0;
  EXPECT_NE(message(o).find("--batch"), std::string::npos);
  o = {};
  o.optimizer.lr = -1;
  EXPECT_NE(message(o).find("--lr"), std::string::npos);
  o = {};
  o.evalEvery = -1;
  EXPECT_NE(message(o).find("--eval-every"), std::string::npos);
}

// The reader (ml/triples.h; this branch has a stand-in, the sparse-mf branch the real one, and
// this test holds for both): dictionaries when present, names numbered by first appearance
// otherwise, and a malformed line named with its file.
TEST(ReadTriples, ReadsTheThreeSplitsAndNamesABadLine) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "chorus_triples_test";
  fs::create_directories(dir);
  auto write = [&](const char* name, const char* text) { std::ofstream(dir / name) << text; };
  write("train.txt", "a\tlikes\tb\nb\tlikes\tc\n");
  write("valid.txt", "c\tknows\ta\n");
  write("test.txt", "a\tknows\tc\n");
  KgData data = readTriples(dir.string());
  EXPECT_EQ(data.entities(), 3u);
  EXPECT_EQ(data.relations(), 2u);
  ASSERT_EQ(data.train.size(), 2u);
  EXPECT_EQ(data.train[1], (Triple{1, 0, 2}));
  EXPECT_EQ(data.valid[0], (Triple{2, 1, 0}));
  write("entities.dict", "0\tc\n1\tb\n2\ta\n");
  write("relations.dict", "0\tlikes\n1\tknows\n");
  data = readTriples(dir.string());
  EXPECT_EQ(data.train[0], (Triple{2, 0, 1}));
  write("test.txt", "a\tknows\n");
  try {
    readTriples(dir.string());
    ADD_FAILURE() << "a line with two fields was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("test.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// The driver is not KGE-specific: a minimal matrix factorization (two tables, squared loss, one
// "test" split, lower RMSE better) plugs into the same interface, as ml/mf does in the sparse-mf
// branch. Ratings come from a planted rank-2 model without noise, so the RMSE can fall far.
class ToyFactorization : public SparseWorkload {
 public:
  ToyFactorization() : rows_("row", 30, 4), cols_("col", 20, 4) {
    rows_.initNormal(1, 0.1);
    cols_.initNormal(2, 0.1);
    Rng rng(3);
    std::vector<double> u(30 * 2), v(20 * 2);
    for (double& x : u)
      x = rng.normal();
    for (double& x : v)
      x = rng.normal();
    for (uint32_t r = 0; r < 30; ++r) {
      for (uint32_t c = 0; c < 20; ++c) {
        const auto y = static_cast<float>(u[2 * r] * v[2 * c] + u[2 * r + 1] * v[2 * c + 1]);
        (rng.uniform() < 0.8 ? train_ : test_).push_back({r, c, y});
      }
    }
  }
  std::string spec() const override { return "toy-mf rank=4"; }
  std::vector<SparseTable*> tables() override { return {&rows_, &cols_}; }
  size_t trainPoints() const override { return train_.size(); }
  double computeGradients(std::span<const size_t> points, Rng&,
                          std::span<SparseGradAccumulator> grads) override {
    double loss = 0.0;
    const auto scale = static_cast<float>(1.0 / static_cast<double>(points.size()));
    for (const size_t i : points) {
      const Rating& x = train_[i];
      const float err = predict(x) - x.value;
      loss += 0.5 * double{err} * err;
      float* gu = grads[0].row(x.row);
      float* gv = grads[1].row(x.col);
      for (size_t k = 0; k < 4; ++k) {
        gu[k] += scale * err * cols_.row(x.col)[k];
        gv[k] += scale * err * rows_.row(x.row)[k];
      }
    }
    return loss / static_cast<double>(points.size());
  }
  std::vector<std::string> evalSplits() const override { return {"test"}; }
  std::vector<NamedMetric> evaluate(const std::string&) override {
    double sum = 0.0;
    for (const Rating& x : test_)
      sum += std::pow(predict(x) - x.value, 2);
    return {{"rmse", std::sqrt(sum / static_cast<double>(test_.size()))}};
  }
  bool higherIsBetter() const override { return false; }

 private:
  float predict(const Rating& x) const {
    float p = 0.0f;
    for (size_t k = 0; k < 4; ++k)
      p += rows_.row(x.row)[k] * cols_.row(x.col)[k];
    return p;
  }
  SparseTable rows_, cols_;
  std::vector<Rating> train_, test_;
};

TEST(SparseTrain, AMatrixFactorizationPlugsIntoTheSameDriver) {
  ToyFactorization mf;
  const double before = mf.evaluate("test")[0].value;
  SparseTrainOptions options;
  options.epochs = 60;
  options.batchSize = 16;
  options.optimizer.lr = 0.05;
  auto progress = quietProgress();
  const SparseTrainReport report = trainSparse(mf, options, progress);
  ASSERT_EQ(report.final.size(), 1u);
  EXPECT_EQ(report.final[0].second[0].name, "rmse");
  // Measured: 1.401 before, 0.334 after (AdaGrad, 60 epochs of 30 steps).
  EXPECT_LT(report.final[0].second[0].value, 0.5 * before);
  std::printf("toy MF: test RMSE %.3f before, %.3f after\n", before,
              report.final[0].second[0].value);
}

// --data-dir DIR finds the triples in DIR itself or in DIR/<name>; a miss lists every place.
TEST(FindTripleDir, LooksInTheFolderThenItsSubFolderAndSaysWhereItLooked) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "chorus_find_triples";
  fs::create_directories(root / "mygraph");
  for (const char* f : {"train.txt", "valid.txt", "test.txt"})
    std::ofstream(root / "mygraph" / f) << "a\tr\tb\n";
  EXPECT_EQ(findTripleDir("mygraph", root.string()), (root / "mygraph").string());
  EXPECT_EQ(findTripleDir("other", (root / "mygraph").string()), (root / "mygraph").string());
  fs::remove(root / "mygraph" / "valid.txt");
  try {
    findTripleDir("mygraph", root.string());
    ADD_FAILURE() << "a folder without valid.txt was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no valid.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--data-dir"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace chorus::ml
