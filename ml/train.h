// Evaluation and the single-node training driver behind `chorus train`; the distributed modes
// measure themselves against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ml/batches.h"
#include "ml/dataset.h"
#include "ml/metrics.h"
#include "ml/model.h"
#include "ml/optimizer.h"

namespace chorus::ml {

// Loss and accuracy of a model over a data set.
struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  size_t samples = 0;
  int classes = 0;
  std::vector<int64_t> confusion;  // classes x classes, row = true label, column = predicted
};

// Evaluates `model` on every sample of `data` in batches (evaluation mode: no dropout). Fills
// the confusion matrix when `withConfusion`. `data` must match the model's input and classes.
// batchSize 0 picks evaluationBatch(model).
Evaluation evaluate(Model& model, const Dataset& data, bool withConfusion = false,
                    size_t batchSize = 0);

// The evaluation batch for `model`: as large as keeps its activations near 16 MiB, between 64
// and 1000 samples. Many nodes evaluate at once on one machine, and the buffers a batch needs
// grow with it: cifar-cnn with batches of 1000 took 577 MB more at peak than with 64, and was
// no faster (measurements in ml/train.cc).
size_t evaluationBatch(const Model& model);

// The confusion matrix as an aligned text table.
std::string formatConfusion(const Evaluation& evaluation);

// Number of correct argmax predictions in `logits` (classes x batch).
size_t countCorrect(const Matrix& logits, std::span<const int32_t> labels);

// Everything `chorus train` can set.
struct TrainOptions {
  DataOptions data;
  ModelSpec model;  // name, hidden, dropout; input and classes come from the data
  int64_t epochs = defaults::kEpochs;
  size_t batchSize = defaults::kBatch;
  double learningRate = defaults::kLearningRate;
  SgdConfig sgd;
  std::string schedule = "constant";  // constant | step | cosine
  double warmupEpochs = 0.0;          // linear warm-up length
  double stepEpochs = 0.0;            // step schedule: decay every this many epochs
  double stepGamma = 0.1;             // step schedule: decay factor
  uint64_t seed = 1;                  // initialization, shuffling, augmentation, dropout
  bool augment = false;               // random crop + horizontal flip of training images
  int cropPadding = 4;                // augment: crop from the image padded by this many pixels
  bool flip = true;                   // augment: also mirror left-right (off for digits)
  size_t trainLimit = 0;              // use only the first N training samples (0 = all)
  std::string metricsPath;            // JSON lines (empty: none)
  std::string savePath;               // checkpoint after every epoch (empty: none)
  std::string resumePath;             // checkpoint to start from (empty: fresh model)
  bool confusion = false;             // compute the final confusion matrix
  int64_t logEverySteps = 100;        // a "step" metrics event every this many steps
};

// What a training run achieved.
struct TrainReport {
  Evaluation test;                  // final test evaluation
  std::vector<double> epochLosses;  // mean training loss of each epoch run here
  std::vector<double> epochTestAccuracy;
  int64_t epochsDone = 0;  // including epochs done before a resume
  int64_t steps = 0;
  double trainSeconds = 0.0;  // wall time of the training loop (no loading, no eval)
  double samplesPerSecond = 0.0;
  size_t parameters = 0;
  std::string modelSpec;
};

// Throws std::invalid_argument naming the flag when an option is out of range (called by
// trainOnData; call it early to fail before loading data).
void validateTrainOptions(const TrainOptions& options);

// Validates options against the data, builds the model (or resumes it), trains, evaluates after
// every epoch and writes metrics and checkpoints. Throws std::invalid_argument for bad options,
// CheckpointError for a bad --resume file, std::runtime_error for unwritable outputs.
TrainReport trainOnData(const TrainOptions& options, const DataSplit& data,
                        ProgressReporter& progress);

// loadDataset(options.data) followed by trainOnData().
TrainReport trainSingleNode(const TrainOptions& options, ProgressReporter& progress);

}  // namespace chorus::ml
