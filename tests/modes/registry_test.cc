#include "modes/registry.h"

#include <gtest/gtest.h>

#include "consensus/consensus_service.h"
#include "node/frame.h"
#include "ping/ping_service.h"
#include "ps/ps_service.h"
#include "topology/topology.h"

namespace chorus::modes {
namespace {

TEST(ModeRegistry, NamesAndServiceIdsAreDistinctAndNoneIsTheRuntimes) {
  EXPECT_EQ(registryProblems(registry()), "");
  EXPECT_EQ(modeNames(), "consensus, ping, ps or single");
  ASSERT_NE(findMode("ps"), nullptr);
  EXPECT_EQ(findMode("ps")->service, &ps::kPsService);
  EXPECT_EQ(findMode("single")->service, nullptr);
  EXPECT_EQ(findMode("gossip"), nullptr);
}

// What `chorus node` dispatches on: --mode takes every mode but single (a topology of one node
// trains alone), and a mode whose session the registry builds brings its check and fingerprint.
TEST(ModeRegistry, EntriesCarryWhatTheCliDispatchesOn) {
  EXPECT_EQ(flagModes(), (std::vector<std::string>{"consensus", "ping", "ps"}));
  EXPECT_EQ(flagModeNames(), "consensus, ping or ps");
  for (const Mode& mode : registry()) {
    SCOPED_TRACE(std::string(mode.name));
    // A mode that does not train has nothing for the CLI's training run to build: the registry
    // builds its session, so it must have a factory.
    EXPECT_EQ(mode.make_session != nullptr, !mode.trains);
  }
  const Mode& ping = *findMode("ping");
  EXPECT_FALSE(ping.trains);
  ModeSettings settings;
  settings.ping.pings_per_peer = 7;
  settings.ping.payload_bytes = 100;
  settings.max_frame_bytes = 1 << 20;
  EXPECT_EQ(ping.fingerprint(settings), (Fingerprint{{"pings", "7"}, {"payload-bytes", "100"}}));
  EXPECT_TRUE(ping.check(settings).ok());
  settings.ping.payload_bytes = 1 << 20;
  EXPECT_FALSE(ping.check(settings).ok());
  EXPECT_TRUE(findMode("consensus")->trains);
  EXPECT_EQ(findMode("ps")->make_session, nullptr);
}

// The training modes' entries check their own options and give their share of the fingerprint
// (after the settings every training run shares, which the CLI writes).
TEST(ModeRegistry, TrainingModesCheckAndFingerprintTheirOwnOptions) {
  ModeSettings settings;
  settings.max_frame_bytes = 256u << 20;
  settings.consensus.mixing = "metropolis";
  settings.consensus.chunk_floats = 1000;
  settings.ps.key_floats = 64;
  settings.ps.cache = false;
  const Mode& consensus = *findMode("consensus");
  const Mode& ps = *findMode("ps");
  EXPECT_EQ(consensus.fingerprint(settings),
            (Fingerprint{{"mixing", "metropolis"},
                         {"staleness", settings.consensus.staleness.toString()},
                         {"chunk-floats", "1000"}}));
  EXPECT_EQ(ps.fingerprint(settings), (Fingerprint{{"staleness", settings.ps.staleness.toString()},
                                                   {"key-floats", "64"},
                                                   {"cache", "no"},
                                                   {"owner-momentum", "clock"},
                                                   {"async-rounds", "cluster"},
                                                   {"bandwidth", "0"}}));
  EXPECT_TRUE(consensus.check(settings).ok());
  EXPECT_TRUE(ps.check(settings).ok());
  settings.consensus.mixing = "median";
  EXPECT_FALSE(consensus.check(settings).ok());
  settings.consensus.mixing = "uniform";
  settings.max_frame_bytes = 1000;  // a chunk of 1000 floats does not fit
  EXPECT_FALSE(consensus.check(settings).ok());
  settings.ps.key_floats = 0;
  EXPECT_FALSE(ps.check(settings).ok());
}

// A training mode's entry says what it builds: a plan for image models, a sparse session, or
// both; the mode with no peers runs every topology of one node whose model it trains.
TEST(ModeRegistry, TrainingEntriesNameTheirPlansAndTheModeWithNoPeers) {
  const Mode& consensus = *findMode("consensus");
  const Mode& ps = *findMode("ps");
  const Mode& single = *findMode("single");
  EXPECT_NE(consensus.plan, nullptr);
  EXPECT_NE(ps.plan, nullptr);
  EXPECT_NE(single.plan, nullptr);
  EXPECT_EQ(findMode("ping")->plan, nullptr);
  EXPECT_EQ(consensus.sparse, SparseTraining::kConsensus);
  EXPECT_EQ(ps.sparse, SparseTraining::kPs);
  EXPECT_EQ(sparseModeNames(), "consensus or ps");
  // Image models: one node trains alone whatever mode is named; more run the named mode.
  EXPECT_EQ(&modeThatRuns(consensus, 1, false), &single);
  EXPECT_EQ(&modeThatRuns(ps, 1, false), &single);
  EXPECT_EQ(&modeThatRuns(consensus, 2, false), &consensus);
  EXPECT_EQ(&modeThatRuns(ps, 4, false), &ps);
  // Sparse models: the mode with no peers does not train them, so one node runs the named mode.
  EXPECT_EQ(&modeThatRuns(ps, 1, true), &ps);
  EXPECT_EQ(&modeThatRuns(ps, 3, true), &ps);
}

// A topology file names a training mode by the name `--mode` takes: topology/ keeps its own
// list (it sits below the registry), and this is where the two are held equal.
TEST(ModeRegistry, TopologyFilesNameExactlyTheTrainingModesTheFlagTakes) {
  std::vector<std::string> in_files;
  for (topology::Mode mode : topology::kFileModes) {
    in_files.emplace_back(topology::modeName(mode));
    EXPECT_EQ(topology::parseMode(topology::modeName(mode)), mode);
  }
  std::vector<std::string> training;
  for (const Mode& mode : registry()) {
    if (mode.trains && mode.named_by_flag) training.emplace_back(mode.name);
    EXPECT_EQ(topology::parseMode(mode.name).has_value(), mode.trains && mode.named_by_flag)
        << mode.name;
  }
  EXPECT_EQ(in_files, training);
}

TEST(ModeRegistry, ProblemsAreNamed) {
  std::vector<Mode> modes = registry();
  modes.push_back({"ping", "again", nullptr});
  EXPECT_EQ(registryProblems(modes), "two modes are called \"ping\"");
  static constexpr node::ServiceSpec kClash{ps::kPsServiceId, "clash"};
  modes = registry();
  modes.push_back({"clash", "takes PS's id", &kClash});
  EXPECT_EQ(registryProblems(modes), "modes \"ps\" and \"clash\" share service id 3");
  static constexpr node::ServiceSpec kRuntime{node::kRuntimeService, "runtime"};
  modes = {{"zero", "the runtime's id", &kRuntime}};
  EXPECT_EQ(registryProblems(modes), "mode \"zero\" has service id 0, the runtime's");
  modes = {{.name = "idle", .description = "trains nothing"}};
  EXPECT_EQ(registryProblems(modes), "mode \"idle\" trains but has no plan and no sparse session");
  modes = {{.name = "mute", .description = "no session", .trains = false}};
  EXPECT_EQ(registryProblems(modes), "mode \"mute\" neither trains nor builds a session");
  modes = registry();
  modes.push_back(*findMode("single"));
  modes.back().name = "solo";
  EXPECT_EQ(registryProblems(modes),
            "mode \"solo\" is a second mode that runs a topology of one node");
}

// Each registered spec reads what its mode writes: a frame encoded with the mode's writer
// passes the spec's Verifier, and the spec reads the kind that was written.
template <class Kind>
void expectSpecReads(const Mode& mode, node::MessageType type, const node::BodyWriter& writer,
                     Kind kind) {
  SCOPED_TRACE(std::string(mode.name));
  ASSERT_EQ(type.service, mode.service);
  const node::SharedFrame frame =
      node::encodeFrame(node::EnvelopeHeader{1, "modes", 1, 0}, type, writer);
  ASSERT_TRUE(node::verifyFrame(frame->data(), frame->envelopeSize(), {}).ok());
  const auto* message = node::envelopeOf(frame->data()).message();
  ASSERT_NE(message, nullptr);
  const std::span<const uint8_t> bytes(message->data(), message->size());
  const node::Status status = node::verifyMessage(*mode.service, bytes, {});
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(mode.service->kind(bytes.data()), static_cast<uint8_t>(kind));
  EXPECT_NE(std::string(mode.service->kind_name(static_cast<uint8_t>(kind))), "");
}

TEST(ModeRegistry, EachServiceVerifiesWhatItsModeWrites) {
  expectSpecReads(*findMode("ping"), ping::messageType(ping::wire::Body::Pong),
                  ping::messageWriter(ping::wire::Body::Pong,
                                      [](flatbuffers::FlatBufferBuilder& b) {
                                        return ping::wire::CreatePong(b, 9).Union();
                                      }),
                  ping::wire::Body::Pong);
  expectSpecReads(
      *findMode("consensus"), consensus::messageType(consensus::wire::Body::TrainingDone),
      consensus::messageWriter(consensus::wire::Body::TrainingDone,
                               [](flatbuffers::FlatBufferBuilder& b) {
                                 return consensus::wire::CreateTrainingDone(b, 4).Union();
                               }),
      consensus::wire::Body::TrainingDone);
  expectSpecReads(*findMode("ps"), ps::messageType(ps::wire::Body::PsClock),
                  ps::messageWriter(ps::wire::Body::PsClock,
                                    [](flatbuffers::FlatBufferBuilder& b) {
                                      return ps::wire::CreatePsClock(b, 7).Union();
                                    }),
                  ps::wire::Body::PsClock);
}

}  // namespace
}  // namespace chorus::modes
