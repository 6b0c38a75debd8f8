// `chorus node --mode ping`'s session on started nodes: what it prints, its exit status, its
// stop, and the frame-size check launch runs before any node starts.
#include "ping/ping_session.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using ping::PingOptions;
using ping::PingOutcome;
using ping::PingSession;

// What a session wrote to `file` (a tmpfile()).
std::string readBack(std::FILE* file) {
  std::rewind(file);
  std::string text;
  char buffer[512];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, file))
    text.append(buffer, n);
  return text;
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using OwnedFile = std::unique_ptr<std::FILE, FileCloser>;

TEST(PingSession, TwoNodesVerifyTheirExchangeAndPrintEveryPeer) {
  PingOptions ping;
  ping.pings_per_peer = 4;
  ping.payload_bytes = 100;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<PingSession>> sessions;
  for (NodeId i = 0; i < 2; ++i) {
    NodeOptions o = fastOptions("lambda", i, {0, 1});
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<Node>(o));
    sessions.push_back(
        std::make_unique<PingSession>(*nodes.back(), std::vector<NodeId>{1 - i}, ping));
    ASSERT_TRUE(nodes.back()->listen().ok());
  }
  for (NodeId i = 0; i < 2; ++i) {
    ASSERT_TRUE(nodes[i]->connect({{1 - i, "127.0.0.1", nodes[1 - i]->port()}}).ok());
  }
  for (auto& node : nodes)
    ASSERT_TRUE(node->waitClusterReady().ok());
  OwnedFile out[2] = {OwnedFile(std::tmpfile()), OwnedFile(std::tmpfile())};
  PingOutcome outcomes[2];
  std::thread other([&] { outcomes[1] = sessions[1]->run(out[1].get()); });
  outcomes[0] = sessions[0]->run(out[0].get());
  other.join();
  for (NodeId i = 0; i < 2; ++i) {
    EXPECT_EQ(outcomes[i].exit_code, 0) << outcomes[i].message;
    const std::string text = readBack(out[i].get());
    EXPECT_NE(text.find(fmt::format("  peer {}: 4 of 4 pongs verified, 4 pings answered", 1 - i)),
              std::string::npos)
        << text;
    EXPECT_NE(text.find(fmt::format("node {}: ping exchange verified with 1 peers in ", i)),
              std::string::npos)
        << text;
  }
  for (auto& node : nodes)
    node->shutdown(100ms);
}

// A peer that never comes fails the session with exit status 5 and the node's id, and no
// success line.
TEST(PingSession, AMissingPeerEndsItWithStatusFive) {
  NodeOptions o = fastOptions("mu", 1, {0, 1});
  o.log_level = spdlog::level::off;
  Node node(o);
  PingOptions ping;
  ping.pings_per_peer = 2;
  ping.timeout = kSoon;
  PingSession session(node, {0}, ping);
  ASSERT_TRUE(node.listen().ok());  // node 0 never comes
  OwnedFile out(std::tmpfile());
  const PingOutcome outcome = session.run(out.get());
  EXPECT_EQ(outcome.exit_code, ping::kPingFailedExit);
  EXPECT_NE(outcome.message.find("node 1: ping to peer 0 failed"), std::string::npos)
      << outcome.message;
  EXPECT_EQ(readBack(out.get()).find("verified with"), std::string::npos);
  node.shutdown(100ms);
}

// stop() (a signal) ends a session that would otherwise wait for its time-out.
TEST(PingSession, StopEndsItAtOnce) {
  NodeOptions o = fastOptions("nu", 1, {0, 1});
  o.log_level = spdlog::level::off;
  Node node(o);
  PingOptions ping;
  ping.timeout = std::chrono::hours(1);
  PingSession session(node, {0}, ping);
  ASSERT_TRUE(node.listen().ok());
  session.stop();
  OwnedFile out(std::tmpfile());
  const PingOutcome outcome = session.run(out.get());
  EXPECT_EQ(outcome.exit_code, ping::kPingFailedExit);
  EXPECT_NE(outcome.message.find("interrupted"), std::string::npos) << outcome.message;
  node.shutdown(100ms);
}

TEST(PingSession, APingLargerThanAFrameIsRefusedNamingTheFlags) {
  PingOptions ping;
  ping.payload_bytes = (1 << 20) - 4096;
  EXPECT_NO_THROW(ping::validatePingFitsFrames(ping, 1 << 20));
  ping.payload_bytes += 1;
  try {
    ping::validatePingFitsFrames(ping, 1 << 20);
    FAIL() << "a ping one byte too large was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "--payload-bytes 1044481 plus a frame's envelope is more than --max-frame-mib 1 "
              "accepts: lower --payload-bytes or raise --max-frame-mib");
  }
}

}  // namespace
}  // namespace chorus::node
