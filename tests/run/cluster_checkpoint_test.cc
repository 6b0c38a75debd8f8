// The node checkpoint format and the cut folder (run/cluster_checkpoint.h): round trips, every
// kind of bad file refused with its name and what to do, and the choice of the cut to resume.
#include "run/cluster_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "run/training_run.h"

namespace chorus::run {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("chorus-cut-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

NodeCheckpoint sample(NodeId node, int64_t cut) {
  NodeCheckpoint c;
  c.header.cluster = "lab";
  c.header.node = node;
  c.header.nodes = 3;
  c.header.mode = "ps";
  c.header.model = "softmax input=1x2x2 classes=3";
  c.header.fingerprint = modelFingerprint(c.header.model, 15);
  c.header.cut = cut;
  c.header.seed = 7;
  c.floats["values"] = {1.5f, -2.0f, 0.25f};
  c.floats["state"] = {};
  c.words["keys"] = {0, 3};
  c.words[std::string(kProgressSection)] = {static_cast<uint64_t>(cut), 40};
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The error `load` throws, or "" when it throws none.
template <typename F>
std::string errorOf(F&& load) {
  try {
    load();
  } catch (const NodeCheckpointError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(NodeCheckpoint, RoundTripsThroughTheCutFolder) {
  TempDir dir("roundtrip");
  const NodeCheckpoint written = sample(1, 20);
  const std::string path = writeNodeCheckpoint(dir.str(), written, 10);
  EXPECT_EQ(path, dir.str() + "/cut-20/node-1.ckpt");
  const NodeCheckpoint read = loadNodeCheckpoint(path);
  EXPECT_EQ(read.header, written.header);
  EXPECT_EQ(read.floats, written.floats);
  EXPECT_EQ(read.words, written.words);
  EXPECT_EQ(readNodeCheckpointHeader(path), written.header);
  // No temporary file is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.str() + "/cut-20"), fs::directory_iterator()),
            1);
}

TEST(NodeCheckpoint, EveryTruncationIsRefusedNamingTheFile) {
  TempDir dir("truncated");
  const std::string path = writeNodeCheckpoint(dir.str(), sample(0, 10), 10);
  const std::string bytes = slurp(path);
  for (size_t keep = 0; keep < bytes.size(); ++keep) {
    spit(path, bytes.substr(0, keep));
    const std::string error = errorOf([&] { loadNodeCheckpoint(path); });
    ASSERT_TRUE(contains(error, path)) << keep << ": " << error;
    ASSERT_TRUE(contains(error, "truncated") || contains(error, "bad magic")) << error;
  }
  spit(path, bytes + "x");
  EXPECT_TRUE(contains(errorOf([&] { loadNodeCheckpoint(path); }), "trailing garbage"));
}

TEST(NodeCheckpoint, AnyFlippedByteIsRefused) {
  TempDir dir("flipped");
  const std::string path = writeNodeCheckpoint(dir.str(), sample(0, 10), 10);
  const std::string bytes = slurp(path);
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    spit(path, bad);
    const std::string error = errorOf([&] { loadNodeCheckpoint(path); });
    ASSERT_FALSE(error.empty()) << "byte " << at << " flipped was accepted";
    ASSERT_TRUE(contains(error, path)) << error;
  }
  // A flip in the body is the checksum's to find, and the message says what to do.
  std::string bad = bytes;
  bad[bytes.size() - 20] ^= 1;
  spit(path, bad);
  const std::string error = errorOf([&] { loadNodeCheckpoint(path); });
  EXPECT_TRUE(contains(error, "checksum mismatch")) << error;
  EXPECT_TRUE(contains(error, "remove this cut's folder")) << error;
}

TEST(NodeCheckpoint, ANewerFormatIsRefusedWithWhatToDo) {
  TempDir dir("newer");
  const std::string path = writeNodeCheckpoint(dir.str(), sample(0, 10), 10);
  std::string bytes = slurp(path);
  bytes[8] = static_cast<char>(kNodeCheckpointVersion + 1);
  spit(path, bytes);
  const std::string error = errorOf([&] { loadNodeCheckpoint(path); });
  EXPECT_TRUE(contains(error, "format version 2")) << error;
  EXPECT_TRUE(contains(error, "the chorus build that wrote it")) << error;
}

TEST(NodeCheckpoint, HeadersOfAnotherRunAreRefused) {
  const NodeCheckpointHeader want = sample(1, 20).header;
  EXPECT_EQ(errorOf([&] { checkHeader(want, want, "f"); }), "");
  auto refused = [&](NodeCheckpointHeader got, const std::string& says) {
    const std::string error = errorOf([&] { checkHeader(got, want, "dir/node-1.ckpt"); });
    EXPECT_TRUE(contains(error, "dir/node-1.ckpt")) << error;
    EXPECT_TRUE(contains(error, says)) << error;
  };
  NodeCheckpointHeader h = want;
  h.cluster = "other";
  refused(h, "written by cluster \"other\", and this is cluster \"lab\"");
  h = want;
  h.node = 2;
  refused(h, "holds node 2's state, not node 1's");
  h = want;
  h.model = "mlp";
  h.fingerprint = 1;
  refused(h, "resume with the --model");
  h = want;
  h.nodes = 4;
  refused(h, "a cluster of 4 nodes");
  h = want;
  h.mode = "consensus";
  refused(h, "written in consensus mode");
  h = want;
  h.seed = 8;
  refused(h, "--seed 8");
  h = want;
  h.cut = 30;
  refused(h, "says cut 30");
}

TEST(NodeCheckpoint, ResumesFromTheNewestCutEveryNodeFinished) {
  TempDir dir("choose");
  for (NodeId node = 0; node < 3; ++node) {
    writeNodeCheckpoint(dir.str(), sample(node, 10), 0);
    writeNodeCheckpoint(dir.str(), sample(node, 20), 0);
  }
  // Cut 30: nodes 0 and 2 only (node 1 died before writing; its temporary file is left).
  writeNodeCheckpoint(dir.str(), sample(0, 30), 0);
  writeNodeCheckpoint(dir.str(), sample(2, 30), 0);
  spit(dir.str() + "/cut-30/node-1.ckpt.tmp.99", "half");
  fs::create_directories(dir.str() + "/cut-x");  // not a cut
  const CutChoice choice = chooseResumeCut(dir.str(), 3);
  EXPECT_EQ(choice.cut, 20);
  ASSERT_EQ(choice.skipped.size(), 1u);
  EXPECT_TRUE(contains(choice.skipped[0], "cut 30")) << choice.skipped[0];
  EXPECT_TRUE(contains(choice.skipped[0], "node(s) 1 did not finish it; skipped"))
      << choice.skipped[0];
}

TEST(NodeCheckpoint, NoCompleteCutIsAnErrorNamingTheFolder) {
  TempDir dir("none");
  EXPECT_TRUE(contains(errorOf([&] { chooseResumeCut(dir.str(), 2); }), "no cut-<step> folders"));
  writeNodeCheckpoint(dir.str(), sample(0, 10), 0);
  const std::string error = errorOf([&] { chooseResumeCut(dir.str(), 2); });
  EXPECT_TRUE(contains(error, dir.str())) << error;
  EXPECT_TRUE(contains(error, "incomplete cuts: 10")) << error;
}

TEST(NodeCheckpoint, ANodeKeepsItsNewestCutsOnly) {
  TempDir dir("prune");
  for (int64_t cut = 10; cut <= 60; cut += 10)
    writeNodeCheckpoint(dir.str(), sample(0, cut), 10);
  std::vector<int64_t> left;
  for (int64_t cut = 10; cut <= 60; cut += 10) {
    if (fs::exists(cutFolder(dir.str(), cut))) left.push_back(cut);
  }
  EXPECT_EQ(left, (std::vector<int64_t>{40, 50, 60}));
}

TEST(NodeCheckpoint, CheckpointFolderDefaultsUnderOut) {
  RunOptions o;
  EXPECT_EQ(checkpointDir(o), "");
  o.checkpoint_every = 5;
  EXPECT_THROW(checkpointDir(o), std::invalid_argument);
  o.out_dir = "runs/a";
  EXPECT_EQ(checkpointDir(o), "runs/a/checkpoints");
  o.checkpoint_dir = "cuts";
  EXPECT_EQ(checkpointDir(o), "cuts");
  TempDir dir("flags");
  o.resume_path = dir.str();
  EXPECT_TRUE(resumesCluster(o));
  EXPECT_THROW(validateCheckpointOptions(o, true), std::invalid_argument);
  EXPECT_NO_THROW(validateCheckpointOptions(o, false));
}

}  // namespace
}  // namespace chorus::run
