// Evaluation (every mode's test accuracy and confusion matrix) and the options `chorus train`
// hands to the sparse models. Training itself runs in run/ (run/training_loop.h,
// run/single_node.h).
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

// The options of `chorus train` that the sparse models (cli/train_sparse.h) share with the image
// models.
struct TrainOptions {
  DataOptions data;
  ModelSpec model;  // name, hidden, dropout; input and classes come from the data
  int64_t epochs = defaults::kEpochs;
  size_t batchSize = defaults::kBatch;
  double learningRate = defaults::kLearningRate;
  uint64_t seed = 1;            // initialization, shuffling, negative samples, generated data
  std::string metricsPath;      // JSON lines (empty: none)
  std::string savePath;         // checkpoint after every epoch (empty: none)
  std::string resumePath;       // checkpoint to start from (empty: fresh model)
  int64_t logEverySteps = 100;  // a "step" metrics event every this many steps
};

}  // namespace chorus::ml
