// Node id from the environment of an existing launcher, and the ping exchange's checks.
#include "launch/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "ping/ping_exchange.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace testing;
using namespace std::chrono_literals;
using launch::EnvironmentLookup;
using launch::LauncherRank;
using launch::rankFromEnvironment;
using ping::PingExchange;
using ping::PingOptions;
using ping::pingPayload;
using ping::PingReport;

EnvironmentLookup fakeEnvironment(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, NoVariableMeansNoRank) {
  std::optional<LauncherRank> rank;
  EXPECT_TRUE(rankFromEnvironment(fakeEnvironment({}), &rank).ok());
  EXPECT_FALSE(rank.has_value());
}

TEST(LaunchEnv, FirstVariableInOrderWins) {
  std::optional<LauncherRank> rank;
  ASSERT_TRUE(
      rankFromEnvironment(fakeEnvironment({{"PMI_RANK", "3"}, {"SLURM_PROCID", "5"}}), &rank).ok());
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->rank, 3u);
  EXPECT_EQ(rank->variable, "PMI_RANK");
  ASSERT_TRUE(rankFromEnvironment(
                  fakeEnvironment({{"SLURM_PROCID", "5"}, {"OMPI_COMM_WORLD_RANK", "7"}}), &rank)
                  .ok());
  EXPECT_EQ(rank->rank, 7u);
  EXPECT_EQ(rank->variable, "OMPI_COMM_WORLD_RANK");
}

TEST(LaunchEnv, MalformedRankIsAnErrorNamingTheVariable) {
  for (const char* bad : {"", "-1", "2x", "99999999999"}) {
    std::optional<LauncherRank> rank;
    const Status status = rankFromEnvironment(fakeEnvironment({{"SLURM_PROCID", bad}}), &rank);
    EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("SLURM_PROCID"), std::string::npos);
    EXPECT_FALSE(rank.has_value());
  }
}

TEST(PingExchange, PayloadIsDeterministicAndDirectional) {
  EXPECT_EQ(pingPayload(1, 0, 1, 1, 100), pingPayload(1, 0, 1, 1, 100));
  EXPECT_NE(pingPayload(1, 0, 1, 1, 100), pingPayload(1, 1, 0, 1, 100));
  EXPECT_NE(pingPayload(1, 0, 1, 1, 100), pingPayload(1, 0, 1, 2, 100));
  EXPECT_NE(pingPayload(1, 0, 1, 1, 100), pingPayload(2, 0, 1, 1, 100));
  EXPECT_EQ(pingPayload(1, 0, 1, 1, 13).size(), 13u);
}

// A peer that echoes a corrupted payload makes the exchange fail with a reason.
TEST(PingExchange, CorruptedEchoIsDetected) {
  NodeOptions o = fastOptions("iota", 1, {0, 1});
  o.peer_timeout = 30s;
  o.log_level = spdlog::level::warn;
  Node node(o);
  PingOptions ping;
  ping.pings_per_peer = 2;
  ping.payload_bytes = 32;
  ping.timeout = kSoon;
  PingExchange exchange(node, {0}, ping);
  ASSERT_TRUE(node.listen().ok());
  ASSERT_TRUE(node.connect({{0, "", 0}}).ok());
  RawPeer raw(node.port());
  ASSERT_TRUE(raw.handshake("iota", 0));
  ASSERT_TRUE(node.waitClusterReady(kSoon).ok());
  PingReport report;
  std::thread runner([&] { report = exchange.run(); });
  // Answer the first ping with a flipped payload byte.
  for (;;) {
    auto frame = raw.readFrame();
    ASSERT_TRUE(frame.has_value());
    ASSERT_TRUE(verifyFrame(frame->data(), frame->size(), FrameLimits{}).ok());
    const ping::wire::Message* message = pingMessageOf(*frame);
    if (message == nullptr || message->body_type() != ping::wire::Body::Ping) continue;
    std::vector<uint8_t> payload(message->body_as_Ping()->payload()->begin(),
                                 message->body_as_Ping()->payload()->end());
    payload[3] ^= 0x40;
    const uint64_t nonce = message->body_as_Ping()->nonce();
    raw.sendFrame(
        makeFrame(0, "iota", ping::wire::Body::Pong, [&](flatbuffers::FlatBufferBuilder& b) {
          return ping::wire::CreatePongDirect(b, nonce, &payload).Union();
        }));
    break;
  }
  runner.join();
  EXPECT_EQ(report.status.code(), ErrorCode::kProtocol);
  EXPECT_NE(report.status.message().find("peer 0 echoed a wrong payload for ping 1"),
            std::string::npos)
      << report.status.message();
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

// A ping to a peer that is not connected fails at once, inside the send: the exchange reports
// it (it once deadlocked the loop thread, whose callback took a mutex it already held).
TEST(PingExchange, APeerThatIsNotConnectedFailsTheExchange) {
  NodeOptions o = fastOptions("kappa", 1, {0, 1});
  o.log_level = spdlog::level::warn;
  Node node(o);
  PingOptions ping;
  ping.pings_per_peer = 2;
  ping.timeout = kSoon;
  PingExchange exchange(node, {0}, ping);
  ASSERT_TRUE(node.listen().ok());  // node 0 never comes
  const PingReport report = exchange.run();
  EXPECT_EQ(report.status.code(), ErrorCode::kNotConnected) << report.status.message();
  EXPECT_NE(report.status.message().find("ping to peer 0 failed"), std::string::npos)
      << report.status.message();
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

}  // namespace
}  // namespace chorus::node
