// test_node's entry point. With "--chorus-child-node ..." the binary runs one node and waits
// for a signal (tests start it as a child process and kill it for real); otherwise GoogleTest.
#include <gtest/gtest.h>

#include <cstring>

namespace chorus::node::testing {
int runChildNode(int argc, char** argv);
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--chorus-child-node") == 0) {
    return chorus::node::testing::runChildNode(argc - 2, argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
