// Data sets: MNIST / Fashion-MNIST (IDX) and CIFAR-10 (binary) readers, a synthetic data set of
// MNIST's shape, data-directory resolution and per-channel normalization.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ml/tensor.h"

namespace chorus::ml {

// A data file is missing, unreadable or malformed. The message names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// N labelled samples. Features are N x D floats, sample after sample; images are stored
// channels-last (HWC), D = channels*height*width.
struct Dataset {
  std::string name;
  SampleShape shape;
  int classes = 10;
  std::vector<float> features;
  std::vector<int32_t> labels;

  // Number of samples.
  size_t size() const { return labels.size(); }
  // Floats per sample.
  size_t dim() const { return shape.size(); }
  // The features of sample i.
  std::span<const float> sample(size_t i) const { return {features.data() + i * dim(), dim()}; }
};

// The training and test parts of a data set, as loaded.
struct DataSplit {
  Dataset train;
  Dataset test;
  std::string source;  // the folder it was read from, or "synthetic(seed=...)"
};

// The names loadDataset() accepts.
const std::vector<std::string>& datasetNames();

// How to find and prepare a data set.
struct DataOptions {
  std::string name;     // mnist | fashion-mnist | cifar10 | synthetic
  std::string dataDir;  // --data-dir: a folder holding the files or their usual sub-folder
  size_t syntheticTrain = 10000;
  size_t syntheticTest = 2000;
  uint64_t syntheticSeed = 1;
  bool normalize = true;  // per-channel mean/std of the training part, applied to both parts
};

// Loads a data set by name. Pixels are scaled to [0, 1] and then, when options.normalize,
// standardized per channel. Throws DataError (missing data: where it looked and how to get it;
// malformed files: which file and what is wrong) or std::invalid_argument (unknown name).
DataSplit loadDataset(const DataOptions& options);

// The training part's labels in file order, read without keeping its samples (bytes per
// sample instead of floats per sample): what a node needs to choose its shard before it reads
// the samples. Same errors as loadDataset().
std::vector<int32_t> loadTrainLabels(const DataOptions& options);

// loadDataset(), keeping of the training part only the samples at `rows` (indices into the
// whole training part; the result's sample k is the one at rows[k]). The files are streamed, so
// that the memory held is the kept samples and the test set, never the whole training set. The
// per-channel normalization uses the statistics of the whole training part, as loadDataset()
// does: the result is exactly loadDataset()'s samples at `rows`, bit for bit. Throws
// std::invalid_argument for a row past the end of the training part.
DataSplit loadDatasetRows(const DataOptions& options, std::span<const size_t> rows);

// The folder that holds `name`'s files: options.dataDir (itself or its usual sub-folder) when
// given, else $CHORUS_DATA/<sub>, <source tree>/data/<sub>, /usr/share/datasets/<sub>, where
// <sub> is mnist, fashion-mnist, cifar-10-batches-bin or wn18rr (knowledge graphs are read by
// readTriples in ml/triples.h, not by loadDataset). Throws DataError listing every place
// looked at and how to get the data.
std::string findDataDir(const std::string& name, const std::string& dataDir);

// Reads an IDX3 unsigned-byte image file (gzip or raw) into [0, 1] floats, 1 x rows x cols.
Dataset readIdxImages(const std::string& path);
// Reads an IDX1 unsigned-byte label file (gzip or raw); every label must be < classes.
std::vector<int32_t> readIdxLabels(const std::string& path, int classes);
// Reads an images file and a labels file; their counts must match.
Dataset readIdxPair(const std::string& imagesPath, const std::string& labelsPath,
                    const std::string& name);
// Appends the records of one CIFAR-10 binary batch (gzip or raw) to `out` (3x32x32, HWC). A
// file that fails (DataError) leaves `out` unchanged.
void readCifarBatch(const std::string& path, Dataset& out);

// N samples of MNIST's shape (1x28x28, 10 classes, pixels in [0, 1]): noisy, shifted copies
// of ten random blob prototypes. Deterministic from the seed; train and test are drawn from the
// same distribution with independent streams. An MLP learns it to well above 95%.
DataSplit makeSynthetic(size_t trainSize, size_t testSize, uint64_t seed);

// Per-channel mean and standard deviation.
struct ChannelStats {
  std::vector<float> mean;
  std::vector<float> stddev;
};
// Statistics of a data set's features, per channel.
ChannelStats channelStats(const Dataset& data);
// x = (x - mean[c]) / stddev[c] in place (stddev 0 is treated as 1).
void normalize(Dataset& data, const ChannelStats& stats);

}  // namespace chorus::ml
