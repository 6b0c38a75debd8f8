// What the command-line tests that run whole jobs share (tests/cli: compare_test,
// compare_sparse_test, sparse_launch_test): a fresh folder per test, a small knowledge graph
// written where `--data planted --data-dir` finds it, and a topology file whose nodes are all
// each other's neighbors on given loopback ports. No process is started here (tests/cli's
// run_command.h runs the CLI and picks free ports).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/planted_graph.h"

namespace chorus::testsupport {

// A fresh, empty folder under the system's temporary folder, named from `prefix`, the process
// and the running GoogleTest test (so parallel tests never share one); removed with everything
// in it on destruction.
class TestFolder {
 public:
  explicit TestFolder(const std::string& prefix);
  ~TestFolder();
  TestFolder(const TestFolder&) = delete;
  TestFolder& operator=(const TestFolder&) = delete;
  // The folder.
  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside it.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The planted graph (makePlantedGraph(options)) as DIR/train.txt, valid.txt and test.txt, for
// `--data planted --data-dir <parent of DIR>` when DIR ends in "planted".
void writePlantedGraphFolder(const std::string& dir, const PlantedGraphOptions& options = {});

// Whether `text` (a command's output, a file) holds `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The whole text of the file at `path` ("" when it cannot be read).
std::string readFile(const std::filesystem::path& path);

// Writes a topology file at `path`: cluster `name` in `mode`, one node per port of `ports`
// (node i at 127.0.0.1:ports[i]), every node the neighbor of every other; `node_lines(i)`, when
// given, is appended to node i's table (e.g. a straggler attribute). Returns `path`.
std::string writeCompleteTopology(const std::string& path, const std::string& name,
                                  const std::string& mode, const std::vector<uint16_t>& ports,
                                  const std::function<std::string(int)>& node_lines = {});

}  // namespace chorus::testsupport
