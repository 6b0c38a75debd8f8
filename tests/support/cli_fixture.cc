#include "tests/support/cli_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace chorus::testsupport {

namespace fs = std::filesystem;

TestFolder::TestFolder(const std::string& prefix) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  path_ = fs::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()) +
                                       (test ? std::string("-") + test->name() : ""));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TestFolder::~TestFolder() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writePlantedGraphFolder(const std::string& dir, const PlantedGraphOptions& options) {
  writeTripleFolder(dir, makePlantedGraph(options));
}

std::string writeCompleteTopology(const std::string& path, const std::string& name,
                                  const std::string& mode, const std::vector<uint16_t>& ports,
                                  const std::function<std::string(int)>& node_lines) {
  std::ofstream out(path);
  out << "[cluster]\nname = \"" << name << "\"\nmode = \"" << mode << "\"\n";
  const int nodes = static_cast<int>(ports.size());
  for (int i = 0; i < nodes; ++i) {
    out << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i]
        << "\"\nneighbors = [";
    for (int k = 1; k < nodes; ++k)
      out << (k > 1 ? ", " : "") << (i + k) % nodes;
    out << "]\n";
    if (node_lines) out << node_lines(i);
  }
  if (!out) throw std::runtime_error("cannot write the topology file " + path);
  return path;
}

}  // namespace chorus::testsupport
