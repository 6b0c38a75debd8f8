// Checkpoint round trip and refusal of corrupt, truncated, foreign and mismatched files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "ml/checkpoint.h"
#include "ml/model.h"

namespace chorus::ml {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "chorus-ckpt-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
    path_ = (fs::path(dir_) / "model.ckpt").string();
    auto model = Model::create({.name = "mlp", .hidden = {16}}, 3);
    original_.modelSpec = model->spec().toString();
    original_.step = 1234;
    original_.epoch = 3;
    original_.seed = 99;
    original_.params.assign(model->params().begin(), model->params().end());
    original_.optimizerState.assign(model->size(), 0.25f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string readAll() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void writeAll(const std::string& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void expectRefused(const std::string& fragment) const {
    try {
      loadCheckpoint(path_);
      ADD_FAILURE() << "loaded a bad checkpoint";
    } catch (const CheckpointError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path_), std::string::npos) << message;
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
    }
  }

  std::string dir_;
  std::string path_;
  Checkpoint original_;
};

TEST_F(CheckpointTest, RoundTripsExactly) {
  saveCheckpoint(path_, original_);
  const Checkpoint loaded = loadCheckpoint(path_);
  EXPECT_EQ(loaded.modelSpec, original_.modelSpec);
  EXPECT_EQ(loaded.step, 1234);
  EXPECT_EQ(loaded.epoch, 3);
  EXPECT_EQ(loaded.seed, 99u);
  EXPECT_EQ(loaded.params, original_.params);
  EXPECT_EQ(loaded.optimizerState, original_.optimizerState);
  EXPECT_NO_THROW(checkCompatible(loaded, path_, original_.modelSpec, original_.params.size()));
  // No temporary file is left behind.
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_))
    ++files;
  EXPECT_EQ(files, 1u);
}

TEST_F(CheckpointTest, OverwritesAtomically) {
  saveCheckpoint(path_, original_);
  Checkpoint next = original_;
  next.epoch = 4;
  saveCheckpoint(path_, next);
  EXPECT_EQ(loadCheckpoint(path_).epoch, 4);
}

TEST_F(CheckpointTest, RefusesAFlippedBit) {
  saveCheckpoint(path_, original_);
  std::string bytes = readAll();
  bytes[bytes.size() / 2] ^= 0x10;
  writeAll(bytes);
  expectRefused("checksum mismatch");
}

TEST_F(CheckpointTest, RefusesTruncationAndTrailingBytes) {
  saveCheckpoint(path_, original_);
  const std::string bytes = readAll();
  writeAll(bytes.substr(0, bytes.size() - 3));
  expectRefused("truncated");
  writeAll(bytes.substr(0, 20));
  expectRefused("truncated");
  writeAll(bytes + "x");
  expectRefused("trailing");
}

TEST_F(CheckpointTest, RefusesForeignFilesAndOtherVersions) {
  writeAll("hello, this is not a checkpoint at all");
  expectRefused("bad magic");
  writeAll("");
  expectRefused("bad magic");
  saveCheckpoint(path_, original_);
  std::string bytes = readAll();
  bytes[8] = 7;  // version field
  writeAll(bytes);
  expectRefused("version 7");
}

TEST_F(CheckpointTest, RefusesAnotherModel) {
  saveCheckpoint(path_, original_);
  const Checkpoint loaded = loadCheckpoint(path_);
  const std::string other = ModelSpec({.name = "mlp", .hidden = {32}}).toString();
  try {
    checkCompatible(loaded, path_, other, loaded.params.size());
    ADD_FAILURE() << "accepted a checkpoint of another model";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden=16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checkCompatible(loaded, path_, loaded.modelSpec, loaded.params.size() + 1),
               CheckpointError);
}

// What is not a regular file is refused before anything is read from it: --resume /dev/zero
// read until memory ran out, and a FIFO without a writer blocked in open() for ever. Checked
// in a child process with an alarm, so that a regression fails instead of hanging (the FIFO
// comes first, so /dev/zero is never read then either).
TEST_F(CheckpointTest, RefusesWhatIsNotARegularFile) {
  const std::string fifo = (fs::path(dir_) / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::vector<std::string> paths{fifo, "/dev/zero", dir_};
  EXPECT_EXIT(
      {
        ::alarm(5);
        size_t refused = 0;
        for (const std::string& path : paths) {
          try {
            loadCheckpoint(path);
          } catch (const CheckpointError& e) {
            const std::string message = e.what();
            if (message.find(path) != std::string::npos &&
                message.find("not a regular file") != std::string::npos) {
              ++refused;
            } else {
              std::fprintf(stderr, "%s\n", message.c_str());
            }
          }
        }
        std::_Exit(refused == paths.size() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The header is checked against the file's size before the rest is read: a header claiming
// 2^40 parameters in a file of a few hundred bytes is refused as truncated.
TEST_F(CheckpointTest, RefusesAHeaderClaimingMoreThanTheFileHolds) {
  saveCheckpoint(path_, original_);
  std::string bytes = readAll();
  const size_t countAt = 16 + original_.modelSpec.size();
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(bytes.data() + countAt, &huge, sizeof huge);
  writeAll(bytes.substr(0, 200));
  expectRefused("truncated");
}

// The checksum only says the file is as written; a crafted or buggy file with a valid XXH3
// can still hold values no run writes. Step -1 gave a NaN learning rate, INT64_MAX overflowed
// the step counter, epoch -3 trained three extra epochs.
TEST_F(CheckpointTest, RefusesStepsEpochsAndStateCountsNoRunWrites) {
  struct Bad {
    int64_t step;
    int64_t epoch;
    size_t state;
    const char* field;
  };
  const int64_t kMaxStep = int64_t{1} << 53;
  const size_t params = original_.params.size();
  for (const Bad& bad :
       {Bad{-1, 0, params, "step -1"},
        Bad{std::numeric_limits<int64_t>::max(), 3, params, "step 9223372036854775807"},
        Bad{kMaxStep + 1, 3, params, "step 9007199254740993"}, Bad{100, -3, params, "epoch -3"},
        Bad{4, 5, params, "epoch 5"}, Bad{100, 3, 7, "7 optimizer state values"},
        Bad{100, 3, params + 1, "optimizer state values"}}) {
    Checkpoint crafted = original_;
    crafted.step = bad.step;
    crafted.epoch = bad.epoch;
    crafted.optimizerState.assign(bad.state, 0.5f);
    saveCheckpoint(path_, crafted);
    expectRefused(bad.field);
  }
  for (const Bad& good : {Bad{0, 0, 0, ""}, Bad{kMaxStep, 3, params, ""}}) {
    Checkpoint fine = original_;
    fine.step = good.step;
    fine.epoch = good.epoch;
    fine.optimizerState.assign(good.state, 0.5f);
    saveCheckpoint(path_, fine);
    EXPECT_NO_THROW(loadCheckpoint(path_));
  }
}

// The one file reader of both checkpoint formats (run/cluster_checkpoint.h reads node files with
// it): at most `limit` bytes, the whole file when it is shorter; what is not a regular file or
// cannot be opened is an error value naming the path.
TEST_F(CheckpointTest, ReadFileUpToReadsAtMostTheLimitAndRefusesWhatIsNoFile) {
  writeFileAtomically(path_, "0123456789");
  node::Result<std::string> all = readFileUpTo(path_);
  ASSERT_TRUE(all.ok()) << all.message();
  EXPECT_EQ(*all, "0123456789");
  node::Result<std::string> head = readFileUpTo(path_, 4);
  ASSERT_TRUE(head.ok()) << head.message();
  EXPECT_EQ(*head, "0123");
  node::Result<std::string> more = readFileUpTo(path_, 100);
  ASSERT_TRUE(more.ok()) << more.message();
  EXPECT_EQ(*more, "0123456789");

  const node::Result<std::string> missing = readFileUpTo(path_ + ".none");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), node::ErrorCode::kIo);
  EXPECT_NE(missing.message().find("cannot open " + path_ + ".none"), std::string::npos)
      << missing.message();
  const node::Result<std::string> folder = readFileUpTo(dir_);
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), node::ErrorCode::kInvalidArgument);
  EXPECT_NE(folder.message().find(dir_ + ": not a regular file"), std::string::npos)
      << folder.message();
}

TEST_F(CheckpointTest, MissingFileIsAClearError) {
  try {
    loadCheckpoint(path_ + ".none");
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

}  // namespace
}  // namespace chorus::ml
