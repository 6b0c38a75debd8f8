// `chorus train` for the sparse workloads: matrix factorization (--model mf, on generated
// Zipf-skewed ratings or a rating file) and knowledge-graph embeddings (--model complex or
// distmult, on WN18RR or any triple folder). train_cmd.cc registers these flags beside the dense
// models' and sends these models here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ml/kge.h"
#include "ml/mf.h"
#include "ml/ratings.h"
#include "ml/train.h"

namespace CLI {
class App;
}

namespace chorus::cli {

// The sparse models' flags. --epochs, --batch, --lr, --seed, --out, --log-every, --save and
// --resume are the dense models' flags too; a sparse model takes its own default for the first
// three when they are not given (the dense defaults suit momentum SGD on images).
struct SparseFlags {
  // Both families.
  std::string reg;        // none | l2 | n3; empty: the model's default (mf l2, KGE n3)
  double regWeight = -1;  // < 0: the model's default
  std::string optimizer = "adagrad";
  double initScale = -1;  // < 0: the model's default
  // --model mf
  ml::MfOptions mf;
  ml::ZipfRatingsOptions zipf;
  std::string dataFile;   // --data ratings
  std::string writeData;  // folder for train.csv and test.csv of the data trained on
  // --model complex | distmult
  ml::KgeConfig kge;
  std::string negatives = "256";
  std::string loss = "logistic";
  int64_t evalEvery = 1;
  double timeLimit = 0.0;
  bool keepBest = false;
  double adagradInitial = 0.0;
};

// The sparse models' defaults for the flags they share with the dense models (chorus train and
// chorus node alike).
namespace sparse_defaults {
inline constexpr int64_t kMfEpochs = 10;
inline constexpr size_t kMfBatch = 1000;
inline constexpr double kMfLr = 0.1;
inline constexpr size_t kKgeBatch = 512;
inline constexpr double kKgeLr = 0.1;
}  // namespace sparse_defaults

// The flags only the dense image models take, only MF takes, only the KGE models take, and only
// the two sparse families take: each family refuses another's, naming it.
extern const std::vector<std::string> kDenseOnlyFlags;
extern const std::vector<std::string> kMfOnlyFlags;
extern const std::vector<std::string> kKgeOnlyFlags;
extern const std::vector<std::string> kSparseFlags;

// Runs `work` (loading and training) and turns what it throws into the command's exit status:
// bad flags (std::invalid_argument) 2, bad files and failed runs 1. A live progress line is
// ended first, so that the error starts on its own line.
void runTraining(ml::ProgressReporter& progress, const std::function<void()>& work);

// True for complex and distmult.
bool isKgeModel(const std::string& model);
// Registers the sparse flags on `train` (chorus train and chorus node).
void addSparseOptions(CLI::App& train, SparseFlags& flags);
// The MF model's options from the sparse flags (the trainer's settings left at their defaults).
// Throws std::invalid_argument naming the flag.
ml::MfOptions mfModelOptions(const SparseFlags& flags);
// The KGE model `model` (complex | distmult) from the sparse flags; validated. Throws
// std::invalid_argument naming the flag.
ml::KgeConfig kgeModelConfig(const std::string& model, const SparseFlags& flags);
// `chorus train --model mf`: generate or read ratings, print their skew, train, compare the test
// RMSE with the noise floor. `train` tells which flags were given.
void runMfTrain(const CLI::App& train, const ml::TrainOptions& options, const SparseFlags& flags);
// `chorus train --model complex|distmult`: knowledge-graph embeddings on a triple folder.
void runKgeTrain(const CLI::App& train, const ml::TrainOptions& options, const SparseFlags& flags);

}  // namespace chorus::cli
