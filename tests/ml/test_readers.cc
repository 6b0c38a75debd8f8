// Readers on small generated files in the real formats (raw and gzip), and on malformed
// variants: wrong magic, truncation, bad labels, count mismatch, trailing bytes, bad gzip.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ml/dataset.h"
#include "tests/ml/temp_dir.h"

namespace chorus::ml {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

using Bytes = std::vector<unsigned char>;

void put32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

Bytes idxImages(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  put32(b, 0x00000803);
  put32(b, count);
  put32(b, rows);
  put32(b, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i)
    b.push_back(static_cast<unsigned char>(i * 7));
  return b;
}

Bytes idxLabels(const std::vector<unsigned char>& labels) {
  Bytes b;
  put32(b, 0x00000801);
  put32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

Bytes cifarRecords(const std::vector<unsigned char>& labels) {
  Bytes b;
  for (size_t r = 0; r < labels.size(); ++r) {
    b.push_back(labels[r]);
    for (int i = 0; i < 3072; ++i)
      b.push_back(static_cast<unsigned char>((i + r) % 251));
  }
  return b;
}

void writeRaw(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void writeGz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

Bytes readRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Expects `fn` to throw DataError whose message contains every fragment.
template <typename Fn>
void expectDataError(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no DataError thrown";
  } catch (const DataError& e) {
    const std::string message = e.what();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
  }
}

TEST(IdxReader, ReadsRawAndGzipIdentically) {
  TempDir dir;
  const Bytes images = idxImages(3, 4, 5);
  writeRaw(dir.file("img"), images);
  writeGz(dir.file("img.gz"), images);
  const Dataset raw = readIdxImages(dir.file("img"));
  const Dataset gz = readIdxImages(dir.file("img.gz"));
  EXPECT_EQ(raw.shape, (SampleShape{1, 4, 5}));
  ASSERT_EQ(raw.features.size(), 60u);
  EXPECT_EQ(raw.features, gz.features);
  EXPECT_FLOAT_EQ(raw.features[1], 7.0f / 255.0f);
  EXPECT_FLOAT_EQ(raw.features[59], static_cast<unsigned char>(59 * 7) / 255.0f);
}

TEST(IdxReader, ReadsAnImageLabelPair) {
  TempDir dir;
  writeGz(dir.file("i.gz"), idxImages(4, 2, 2));
  writeRaw(dir.file("l"), idxLabels({3, 0, 9, 1}));
  const Dataset data = readIdxPair(dir.file("i.gz"), dir.file("l"), "mnist");
  EXPECT_EQ(data.size(), 4u);
  EXPECT_EQ(data.labels, (std::vector<int32_t>{3, 0, 9, 1}));
  EXPECT_EQ(data.name, "mnist");
}

TEST(IdxReader, RefusesWrongMagic) {
  TempDir dir;
  Bytes bytes = idxImages(2, 2, 2);
  bytes[3] = 0x01;  // a label file's magic
  writeRaw(dir.file("img"), bytes);
  expectDataError([&] { readIdxImages(dir.file("img")); }, {dir.file("img"), "wrong magic"});
  writeRaw(dir.file("labels"), idxImages(2, 2, 2));
  expectDataError([&] { readIdxLabels(dir.file("labels"), 10); }, {"labels", "wrong magic"});
}

TEST(IdxReader, RefusesTruncatedFilesRawAndGzip) {
  TempDir dir;
  Bytes bytes = idxImages(3, 4, 4);
  bytes.resize(bytes.size() - 5);
  writeRaw(dir.file("img"), bytes);
  writeGz(dir.file("img.gz"), bytes);
  expectDataError([&] { readIdxImages(dir.file("img")); }, {dir.file("img"), "truncated"});
  expectDataError([&] { readIdxImages(dir.file("img.gz")); }, {dir.file("img.gz"), "truncated"});
  // A header cut short.
  writeRaw(dir.file("short"), Bytes{0, 0, 8, 3, 0, 0});
  expectDataError([&] { readIdxImages(dir.file("short")); }, {"short", "truncated"});
  writeRaw(dir.file("empty"), Bytes{});
  expectDataError([&] { readIdxImages(dir.file("empty")); }, {"empty", "truncated"});
}

TEST(IdxReader, RefusesACutGzipStream) {
  TempDir dir;
  writeGz(dir.file("img.gz"), idxImages(50, 28, 28));
  Bytes gz = readRaw(dir.file("img.gz"));
  gz.resize(gz.size() / 2);
  writeRaw(dir.file("cut.gz"), gz);
  expectDataError([&] { readIdxImages(dir.file("cut.gz")); }, {dir.file("cut.gz")});
}

TEST(IdxReader, RefusesTrailingBytes) {
  TempDir dir;
  Bytes bytes = idxLabels({1, 2, 3});
  bytes.push_back(4);
  writeRaw(dir.file("labels"), bytes);
  expectDataError([&] { readIdxLabels(dir.file("labels"), 10); }, {"labels", "longer"});
}

TEST(IdxReader, RefusesOutOfRangeLabelsNamingTheRecord) {
  TempDir dir;
  std::vector<unsigned char> labels(600, 1);
  labels[503] = 11;
  writeGz(dir.file("labels.gz"), idxLabels(labels));
  expectDataError([&] { readIdxLabels(dir.file("labels.gz"), 10); },
                  {dir.file("labels.gz"), "label 11 in record 503"});
}

TEST(IdxReader, RefusesImplausibleDimensions) {
  TempDir dir;
  Bytes bytes;
  put32(bytes, 0x00000803);
  put32(bytes, 0);
  put32(bytes, 28);
  put32(bytes, 28);
  writeRaw(dir.file("img"), bytes);
  expectDataError([&] { readIdxImages(dir.file("img")); }, {"img", "dimensions"});
}

TEST(IdxReader, RefusesHugeClaimedCountWithoutHugeAllocation) {
  TempDir dir;
  Bytes bytes;
  put32(bytes, 0x00000803);
  put32(bytes, 0xFFFFFFFFu);
  put32(bytes, 28);
  put32(bytes, 28);
  bytes.resize(bytes.size() + 100, 0);
  writeRaw(dir.file("img"), bytes);
  expectDataError([&] { readIdxImages(dir.file("img")); }, {"img", "truncated"});
}

TEST(IdxReader, RefusesMismatchedImageAndLabelCounts) {
  TempDir dir;
  writeRaw(dir.file("i"), idxImages(3, 2, 2));
  writeRaw(dir.file("l"), idxLabels({1, 2}));
  expectDataError([&] { readIdxPair(dir.file("i"), dir.file("l"), "mnist"); },
                  {"3 images", "2 labels"});
}

TEST(IdxReader, MissingFileNamesIt) {
  expectDataError([] { readIdxImages("/nonexistent/chorus/img"); },
                  {"/nonexistent/chorus/img", "cannot open"});
}

TEST(CifarReader, ReadsRecordsAsChannelsLastRawAndGzip) {
  TempDir dir;
  const Bytes records = cifarRecords({6, 9, 0});
  writeRaw(dir.file("b.bin"), records);
  writeGz(dir.file("b.bin.gz"), records);
  Dataset raw, gz;
  readCifarBatch(dir.file("b.bin"), raw);
  readCifarBatch(dir.file("b.bin.gz"), gz);
  EXPECT_EQ(raw.shape, (SampleShape{3, 32, 32}));
  EXPECT_EQ(raw.labels, (std::vector<int32_t>{6, 9, 0}));
  EXPECT_EQ(raw.features, gz.features);
  // Record 1, pixel 5, green: file offset 1 + 1024 + 5 -> value (1024 + 5 + 1) % 251.
  const float green = raw.features[3072 + 5 * 3 + 1];
  EXPECT_FLOAT_EQ(green, static_cast<float>((1024 + 5 + 1) % 251) / 255.0f);
  // Appending a second batch.
  readCifarBatch(dir.file("b.bin"), raw);
  EXPECT_EQ(raw.size(), 6u);
}

TEST(CifarReader, RefusesPartialRecordsBadLabelsAndEmptyFiles) {
  TempDir dir;
  Bytes records = cifarRecords({1, 2, 3});
  records.resize(records.size() - 1000);
  writeGz(dir.file("cut.bin.gz"), records);
  Dataset data;
  expectDataError([&] { readCifarBatch(dir.file("cut.bin.gz"), data); },
                  {"cut.bin.gz", "truncated", "record 2"});
  std::vector<unsigned char> labels(510, 4);
  labels[503] = 11;
  writeRaw(dir.file("bad.bin"), cifarRecords(labels));
  Dataset other;
  expectDataError([&] { readCifarBatch(dir.file("bad.bin"), other); },
                  {"bad.bin", "label 11 in record 503"});
  writeRaw(dir.file("empty.bin"), Bytes{});
  Dataset empty;
  expectDataError([&] { readCifarBatch(dir.file("empty.bin"), empty); }, {"empty.bin", "empty"});
}

// A batch that fails leaves the data set as it was: the records read before the bad one are
// not appended.
TEST(CifarReader, AFailedBatchAppendsNothing) {
  TempDir dir;
  writeRaw(dir.file("good.bin"), cifarRecords({6, 9, 0}));
  writeRaw(dir.file("bad.bin"), cifarRecords({1, 2, 12, 3}));
  Dataset data;
  readCifarBatch(dir.file("good.bin"), data);
  const std::vector<float> features = data.features;
  expectDataError([&] { readCifarBatch(dir.file("bad.bin"), data); },
                  {"bad.bin", "label 12 in record 2"});
  EXPECT_EQ(data.labels, (std::vector<int32_t>{6, 9, 0}));
  EXPECT_EQ(data.features.size(), features.size());
  EXPECT_TRUE(data.features == features);
  // Nor does a first batch that fails set the shape of an empty data set.
  Dataset fresh;
  expectDataError([&] { readCifarBatch(dir.file("bad.bin"), fresh); }, {"label 12"});
  EXPECT_TRUE(fresh.labels.empty());
  EXPECT_TRUE(fresh.features.empty());
  EXPECT_EQ(fresh.shape, SampleShape{});
}

TEST(DataDir, FindsFilesDirectlyOrInTheUsualSubfolder) {
  TempDir dir;
  fs::create_directories(fs::path(dir.path()) / "mnist");
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte.gz"}) {
    writeRaw((fs::path(dir.path()) / "mnist" / name).string(), Bytes{0});
  }
  EXPECT_EQ(findDataDir("mnist", dir.path()), (fs::path(dir.path()) / "mnist").string());
  EXPECT_EQ(findDataDir("mnist", dir.file("mnist")), dir.file("mnist"));
}

TEST(DataDir, MissingDataSaysWhereItLookedAndHowToGetIt) {
  TempDir dir;
  fs::create_directories(fs::path(dir.path()) / "cifar-10-batches-bin");
  writeRaw(dir.file("cifar-10-batches-bin/data_batch_1.bin"), Bytes{0});
  expectDataError(
      [&] { findDataDir("cifar10", dir.path()); },
      {dir.path(), "missing data_batch_2.bin", "cifar-10-binary.tar.gz", "cifar-10-batches-bin"});
  expectDataError([&] { findDataDir("mnist", dir.path()); },
                  {"yann.lecun.com/exdb/mnist", "train-images-idx3-ubyte"});
  // Without --data-dir, $CHORUS_DATA is the first place looked.
  ::setenv("CHORUS_DATA", dir.path().c_str(), 1);
  expectDataError([&] { findDataDir("mnist", ""); },
                  {"$CHORUS_DATA", dir.file("mnist"), "/usr/share/datasets/mnist"});
  ::unsetenv("CHORUS_DATA");
  EXPECT_THROW(findDataDir("imagenet", ""), std::invalid_argument);
}

TEST(LoadDataset, LoadsAGeneratedMnistFolderAndNormalizes) {
  TempDir dir;
  const std::string folder = dir.file("fashion-mnist");
  fs::create_directories(folder);
  writeGz(folder + "/train-images-idx3-ubyte.gz", idxImages(6, 28, 28));
  writeGz(folder + "/train-labels-idx1-ubyte.gz", idxLabels({0, 1, 2, 3, 4, 5}));
  writeRaw(folder + "/t10k-images-idx3-ubyte", idxImages(2, 28, 28));
  writeRaw(folder + "/t10k-labels-idx1-ubyte", idxLabels({9, 8}));
  const DataSplit split = loadDataset({.name = "fashion-mnist", .dataDir = dir.path()});
  EXPECT_EQ(split.source, folder);
  EXPECT_EQ(split.train.size(), 6u);
  EXPECT_EQ(split.test.labels, (std::vector<int32_t>{9, 8}));
  const ChannelStats stats = channelStats(split.train);
  EXPECT_NEAR(stats.mean[0], 0.0f, 1e-4);
  EXPECT_NEAR(stats.stddev[0], 1.0f, 1e-3);
}

TEST(LoadDataset, LoadsAGeneratedCifarFolder) {
  TempDir dir;
  for (int b = 1; b <= 5; ++b) {
    writeGz(dir.file("data_batch_" + std::to_string(b) + ".bin.gz"),
            cifarRecords({static_cast<unsigned char>(b), 0}));
  }
  writeRaw(dir.file("test_batch.bin"), cifarRecords({7}));
  const DataSplit split =
      loadDataset({.name = "cifar10", .dataDir = dir.path(), .normalize = false});
  EXPECT_EQ(split.train.size(), 10u);
  EXPECT_EQ(split.train.labels[8], 5);
  EXPECT_EQ(split.test.labels, (std::vector<int32_t>{7}));
  EXPECT_EQ(split.test.shape, (SampleShape{3, 32, 32}));
}

// loadDatasetRows() must give exactly loadDataset()'s samples at the rows, normalized with the
// whole training part's statistics, for every reader.
void expectRowsMatchFullLoad(const DataOptions& options, const std::vector<size_t>& rows) {
  SCOPED_TRACE(options.name);
  const DataSplit full = loadDataset(options);
  const DataSplit part = loadDatasetRows(options, rows);
  EXPECT_EQ(part.source, full.source);
  EXPECT_EQ(part.train.shape, full.train.shape);
  EXPECT_EQ(part.train.classes, full.train.classes);
  ASSERT_EQ(part.train.size(), rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    EXPECT_EQ(part.train.labels[k], full.train.labels[rows[k]]) << "row " << rows[k];
    const auto want = full.train.sample(rows[k]);
    const auto got = part.train.sample(k);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "row " << rows[k];
  }
  EXPECT_EQ(part.test.features, full.test.features);
  EXPECT_EQ(part.test.labels, full.test.labels);
  EXPECT_EQ(loadTrainLabels(options), full.train.labels);
}

TEST(LoadDatasetRows, KeepsExactlyTheFullLoadsSamplesAtTheRows) {
  TempDir dir;
  const std::string folder = dir.file("mnist");
  fs::create_directories(folder);
  // More images than one 4 MB read chunk holds, so that rows span chunks.
  const uint32_t count = 5400;
  Bytes images = idxImages(count, 28, 28);
  std::vector<unsigned char> labels(count);
  for (uint32_t i = 0; i < count; ++i) {
    labels[i] = static_cast<unsigned char>((i * 7) % 10);
    images[16 + size_t{i} * 784 + (i % 784)] = static_cast<unsigned char>(i % 256);
  }
  writeGz(folder + "/train-images-idx3-ubyte.gz", images);
  writeRaw(folder + "/train-labels-idx1-ubyte", idxLabels(labels));
  writeRaw(folder + "/t10k-images-idx3-ubyte", idxImages(3, 28, 28));
  writeRaw(folder + "/t10k-labels-idx1-ubyte", idxLabels({9, 8, 1}));
  const std::vector<size_t> rows{5399, 0, 17, 5350, 4, 2600};  // out of order, as shards are
  expectRowsMatchFullLoad({.name = "mnist", .dataDir = dir.path()}, rows);
  expectRowsMatchFullLoad({.name = "mnist", .dataDir = dir.path(), .normalize = false}, rows);
  expectRowsMatchFullLoad({.name = "mnist", .dataDir = dir.path()}, {});

  TempDir cifar;
  for (int b = 1; b <= 5; ++b) {
    writeGz(cifar.file("data_batch_" + std::to_string(b) + ".bin.gz"),
            cifarRecords({static_cast<unsigned char>(b), 0, static_cast<unsigned char>(9 - b)}));
  }
  writeRaw(cifar.file("test_batch.bin"), cifarRecords({7, 3}));
  expectRowsMatchFullLoad({.name = "cifar10", .dataDir = cifar.path()}, {14, 0, 7, 3});

  expectRowsMatchFullLoad({.name = "synthetic", .syntheticTrain = 300, .syntheticTest = 20},
                          {299, 5, 6});
}

TEST(LoadDatasetRows, RefusesARowPastTheEndAndMismatchedFiles) {
  TempDir dir;
  writeRaw(dir.file("train-images-idx3-ubyte"), idxImages(4, 2, 2));
  writeRaw(dir.file("train-labels-idx1-ubyte"), idxLabels({0, 1, 2, 3}));
  writeRaw(dir.file("t10k-images-idx3-ubyte"), idxImages(1, 2, 2));
  writeRaw(dir.file("t10k-labels-idx1-ubyte"), idxLabels({5}));
  const DataOptions options{.name = "mnist", .dataDir = dir.path()};
  const std::vector<size_t> past{1, 4};
  try {
    loadDatasetRows(options, past);
    ADD_FAILURE() << "row 4 of 4 samples was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 4 is past the end"), std::string::npos) << e.what();
  }
  writeRaw(dir.file("train-labels-idx1-ubyte"), idxLabels({0, 1, 2}));
  const std::vector<size_t> rows{1};
  expectDataError([&] { loadDatasetRows(options, rows); },
                  {"holds 4 images but", "train-labels-idx1-ubyte", "holds 3 labels"});
}

TEST(Synthetic, IsDeterministicShapedLikeMnistAndBalanced) {
  const DataSplit a = makeSynthetic(2000, 100, 5);
  const DataSplit b = makeSynthetic(2000, 100, 5);
  const DataSplit c = makeSynthetic(2000, 100, 6);
  EXPECT_EQ(a.train.shape, (SampleShape{1, 28, 28}));
  EXPECT_EQ(a.train.features, b.train.features);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_NE(a.train.features, c.train.features);
  EXPECT_NE(a.train.features, std::vector<float>(a.test.features.begin(), a.test.features.end()));
  std::vector<int> counts(10, 0);
  for (int32_t label : a.train.labels)
    ++counts[static_cast<size_t>(label)];
  for (int count : counts)
    EXPECT_NEAR(count, 200, 60);
  for (float v : a.train.features)
    ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
}

}  // namespace
}  // namespace chorus::ml
