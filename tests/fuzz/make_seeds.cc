// Writes the seed corpus of every fuzz target from the real writers: frames of every runtime body
// type and every service's message as the runtime encodes them, and small files in the real formats
// (IDX, CIFAR-10, triples, ratings, checkpoints, metrics lines, topologies). Seeds made by the code
// itself follow every format change; a committed corpus would go stale.
//   chorus_fuzz_seeds OUT_DIR   (writes OUT_DIR/<target>/seed-*)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "consensus/consensus_service.h"
#include "ml/checkpoint.h"
#include "node/frame.h"
#include "ping/ping_service.h"
#include "ps/codec.h"
#include "ps/key_store.h"
#include "ps/ps_service.h"
#include "ps/replica_codec.h"
#include "ps/replica_layout.h"
#include "run/cluster_checkpoint.h"
#include "topology/topology.h"

namespace fs = std::filesystem;
using namespace chorus;

namespace {

class Seeds {
 public:
  Seeds(const fs::path& root, const std::string& target) : dir_(root / target) {
    fs::create_directories(dir_);
  }
  void add(const std::string& bytes) {
    std::ofstream out(dir_ / ("seed-" + std::to_string(next_++)), std::ios::binary);
    out << bytes;
  }

 private:
  fs::path dir_;
  int next_ = 0;
};

std::string bytesOf(const node::SharedFrame& frame) {
  std::string out;
  for (auto piece : frame->pieces())
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

void frameSeeds(const fs::path& root) {
  using flatbuffers::FlatBufferBuilder;
  using flatbuffers::Offset;
  namespace w = wire;
  node::EnvelopeHeader header{.sender = 1, .cluster = "fuzz", .sequence = 1, .send_time_ns = 5};
  std::vector<std::pair<w::Body, node::BodyWriter>> bodies = {
      {w::Body::Hello,
       [](FlatBufferBuilder& b) {
         auto cluster = b.CreateString("fuzz");
         std::vector<uint8_t> nonce(32, 7);
         auto n = b.CreateVector(nonce);
         auto run = b.CreateString("mode=consensus\nmodel=mlp\n");
         return w::CreateHello(b, cluster, 1, 3, n, run).Union();
       }},
      {w::Body::Welcome, [](FlatBufferBuilder& b) { return w::CreateWelcome(b, 0, 3).Union(); }},
      {w::Body::Challenge,
       [](FlatBufferBuilder& b) {
         std::vector<uint8_t> bytes(32, 1);
         auto nonce = b.CreateVector(bytes);
         auto mac = b.CreateVector(bytes);
         return w::CreateChallenge(b, nonce, mac).Union();
       }},
      {w::Body::Proof,
       [](FlatBufferBuilder& b) {
         std::vector<uint8_t> bytes(32, 2);
         return w::CreateProof(b, b.CreateVector(bytes)).Union();
       }},
      {w::Body::Refuse,
       [](FlatBufferBuilder& b) {
         return w::CreateRefuse(b, b.CreateString("another cluster"), true).Union();
       }},
      {w::Body::Heartbeat, [](FlatBufferBuilder& b) { return w::CreateHeartbeat(b, 9).Union(); }},
      {w::Body::Leave,
       [](FlatBufferBuilder& b) { return w::CreateLeave(b, b.CreateString("done")).Union(); }},
  };
  std::vector<node::SharedFrame> frames;
  for (auto& [type, writer] : bodies)
    frames.push_back(node::encodeFrame(header, type, writer));
  // Every service's messages, as the node encodes them (Envelope.service and the message).
  const std::vector<std::pair<ping::wire::Body, node::BodyWriter>> ping_messages = {
      {ping::wire::Body::Ping,
       [](FlatBufferBuilder& b) {
         std::vector<uint8_t> payload(16, 3);
         return ping::wire::CreatePing(b, 4, b.CreateVector(payload)).Union();
       }},
      {ping::wire::Body::Pong,
       [](FlatBufferBuilder& b) {
         std::vector<uint8_t> payload(16, 3);
         return ping::wire::CreatePong(b, 4, b.CreateVector(payload)).Union();
       }},
      {ping::wire::Body::Tensor,
       [](FlatBufferBuilder& b) {
         std::vector<float> values{1, 2, 3, 4};
         return ping::wire::CreateTensor(b, 1, b.CreateVector(values)).Union();
       }},
  };
  for (auto& [kind, writer] : ping_messages) {
    frames.push_back(
        node::encodeFrame(header, ping::messageType(kind), ping::messageWriter(kind, writer)));
  }
  const std::vector<std::pair<consensus::wire::Body, node::BodyWriter>> consensus_messages = {
      {consensus::wire::Body::ModelShare,
       [](FlatBufferBuilder& b) {
         std::vector<float> values{0.5f, -0.5f, 0.25f};
         auto v = b.CreateVector(values);
         return consensus::wire::CreateModelShare(b, 3, 0, 3, 1, v,
                                                  consensus::wire::SharePurpose::Gossip)
             .Union();
       }},
      {consensus::wire::Body::ModelRequest,
       [](FlatBufferBuilder& b) {
         return consensus::wire::CreateModelRequest(b, b.CreateString("rejoin")).Union();
       }},
      {consensus::wire::Body::TrainingDone,
       [](FlatBufferBuilder& b) { return consensus::wire::CreateTrainingDone(b, 40).Union(); }},
  };
  for (auto& [kind, writer] : consensus_messages) {
    frames.push_back(node::encodeFrame(header, consensus::messageType(kind),
                                       consensus::messageWriter(kind, writer)));
  }
  const std::vector<std::pair<ps::wire::Body, node::BodyWriter>> ps_messages = {
      {ps::wire::Body::PsPull,
       [](FlatBufferBuilder& b) {
         std::vector<uint64_t> keys{0, 1, 5};
         return ps::wire::CreatePsPull(b, 7, 3, 1, b.CreateVector(keys)).Union();
       }},
      {ps::wire::Body::PsPush,
       [](FlatBufferBuilder& b) {
         std::vector<uint64_t> keys{0, 1};
         std::vector<float> values{0.1f, 0.2f};
         auto k = b.CreateVector(keys);
         auto v = b.CreateVector(values);
         return ps::wire::CreatePsPush(b, 8, 3, k, v).Union();
       }},
      {ps::wire::Body::PsClock,
       [](FlatBufferBuilder& b) { return ps::wire::CreatePsClock(b, 4).Union(); }},
      {ps::wire::Body::PsReply,
       [](FlatBufferBuilder& b) {
         std::vector<uint64_t> keys{0, 1};
         std::vector<float> values{0.1f, 0.2f};
         auto k = b.CreateVector(keys);
         auto v = b.CreateVector(values);
         return ps::wire::CreatePsReply(b, 7, ps::wire::PsOp::Pull, 0, 2, k, v).Union();
       }},
      {ps::wire::Body::PsCatchupRequest,
       [](FlatBufferBuilder& b) { return ps::wire::CreatePsCatchupRequest(b).Union(); }},
      {ps::wire::Body::TrainingDone,
       [](FlatBufferBuilder& b) { return ps::wire::CreateTrainingDone(b, 40).Union(); }},
      {ps::wire::Body::PsCatchupReply,
       [](FlatBufferBuilder& b) {
         std::vector<uint32_t> workers{0, 1};
         std::vector<int64_t> clocks{3, 4};
         std::vector<uint8_t> counted{1, 0};
         std::vector<uint64_t> keys{2};
         std::vector<float> values{1.5f};
         auto wk = b.CreateVector(workers);
         auto c = b.CreateVector(clocks);
         auto ct = b.CreateVector(counted);
         auto k = b.CreateVector(keys);
         auto v = b.CreateVector(values);
         return ps::wire::CreatePsCatchupReply(b, 0, wk, c, ct, k, v, 3).Union();
       }},
  };
  for (auto& [kind, writer] : ps_messages) {
    frames.push_back(
        node::encodeFrame(header, ps::messageType(kind), ps::messageWriter(kind, writer)));
  }
  Seeds seeds(root, "fuzz_frame");
  std::string stream;
  for (const node::SharedFrame& encoded : frames) {
    std::string frame = bytesOf(encoded);
    // control bytes: mode, bytes per read - 1, landing pieces, budget
    seeds.add(std::string("\x00\xff\x00\x00", 4) + frame);
    stream += frame;
  }
  // One frame with an attachment, read to a landing in pieces, then a Ping, as one stream.
  static const std::vector<float> floats(300, 0.75f);
  node::Attachment attachment;
  node::appendPiece(attachment, node::bytesOf(std::span<const float>(floats)));
  std::string with_attachment = bytesOf(
      node::encodeFrame(header, ps::messageType(ps::wire::Body::PsPush),
                        ps::messageWriter(ps::wire::Body::PsPush,
                                          [](FlatBufferBuilder& b) {
                                            std::vector<uint64_t> keys{0, 1, 2};
                                            auto k = b.CreateVector(keys);
                                            return ps::wire::CreatePsPush(b, 9, 1, k, 0).Union();
                                          }),
                        0, attachment));
  seeds.add(std::string("\x06\x3f\x03\x01", 4) + with_attachment + stream.substr(0, 200));
  seeds.add(std::string("\x05\x10\x00\x01", 4) + stream);

  // fuzz_sealed_frame: the same frames as records (control byte: what the wire does; 0 passes
  // it on), sealed by the harness; then one with an attachment into a landing, and attacks.
  Seeds sealed(root, "fuzz_sealed_frame");
  auto record = [](char control, const std::string& frame) {
    std::string out(1, control);
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    return out + frame;
  };
  std::string all;
  for (const node::SharedFrame& encoded : frames)
    all += record(0, bytesOf(encoded));
  sealed.add(std::string("\x00\xff\x00", 3) + all);
  sealed.add(std::string("\x01\x0f\x00", 3) + all);
  const std::string ping = bytesOf(frames[7]);
  sealed.add(std::string("\x03\x3f\x03", 3) + record(0, with_attachment) + record(0, ping) +
             record(0, with_attachment));
  sealed.add(std::string("\x06\xff\x02", 3) + record(0, with_attachment) + record(0, ping));
  // A flipped bit (at bit 0x0123), a replay, a drop, a forgery, each after a good frame.
  for (char attack : {'\x04', '\x05', '\x06', '\x07'}) {
    std::string script = std::string("\x02\x40\x02", 3) + record(0, ping);
    script += record(attack, attack == '\x04' ? with_attachment : ping);
    if (attack == '\x04') script += std::string("\x23\x01", 2);
    script += record(0, ping);
    sealed.add(script);
  }
}

void fileSeeds(const fs::path& root) {
  {
    Seeds idx(root, "fuzz_idx");
    std::string images = be32(0x00000803) + be32(2) + be32(3) + be32(3) + std::string(18, '\x40');
    idx.add(std::string(1, '\0') + images);
    std::string labels = be32(0x00000801) + be32(3) + std::string("\x01\x02\x09", 3);
    idx.add(std::string(1, '\1') + labels);
  }
  {
    Seeds cifar(root, "fuzz_cifar");
    std::string record(3073, '\x20');
    record[0] = 3;
    cifar.add(record + record);
  }
  {
    Seeds triples(root, "fuzz_triples");
    const std::string sep = "\n~~~\n";
    std::string train = "a\tr\tb\nb\tr\tc\nc\ts\ta\n";
    triples.add(train + sep + "a\tr\tc\n" + sep + "b\ts\tc\n");
    triples.add(train + sep + "a\tr\tc\n" + sep + "b\ts\tc\n" + sep + "0\ta\n1\tb\n2\tc\n" + sep +
                "0\tr\n1\ts\n");
  }
  {
    Seeds ratings(root, "fuzz_ratings");
    ratings.add("userId,movieId,rating,timestamp\n1,10,4.0,9\n2,10,3.5,9\n1,11,1,9\n3,12,5,9\n");
    ratings.add("1::10::4::9\n2::10::3::9\n1::11::1::9\n");
    ratings.add("u1,i1,2.5\nu2,i2,-1e3\n");
  }
  {
    Seeds checkpoints(root, "fuzz_checkpoint");
    auto path = fs::temp_directory_path() / ("chorus-seed-" + std::to_string(::getpid()) + ".ckpt");
    for (bool momentum : {false, true}) {
      ml::Checkpoint c;
      c.modelSpec = "softmax input=1x2x2 classes=3";
      c.step = 12;
      c.epoch = 2;
      c.seed = 3;
      c.params = {0.5f, -1, 2, 0.25f, 1, 1, 1, 1, 0, 0, 0, 0, 1, 2, 3};
      if (momentum) c.optimizerState.assign(c.params.size(), 0.125f);
      ml::saveCheckpoint(path.string(), c);
      std::ifstream in(path, std::ios::binary);
      checkpoints.add(std::string(std::istreambuf_iterator<char>(in), {}));
    }
    fs::remove(path);
    // A node's part of a whole-cluster cut, as each mode writes it.
    for (const char* mode : {"consensus", "ps"}) {
      run::NodeCheckpoint node;
      node.header = {1, "lab", 1, 3, mode, "softmax input=1x2x2 classes=3", 42, 20, 5};
      node.floats[std::string(run::kOptimizerSection)] = {0.5f, 0.25f, 0, 1};
      node.words[std::string(run::kProgressSection)] = {20, 20};
      if (std::string(mode) == "ps") {
        node.words["keys"] = {1, 4};
        node.words["updates"] = {60, 60};
        node.words["key_floats"] = {2};
        node.floats["values"] = {1, 2, 3, 4};
        node.floats["state"] = {0, 0, 0, 0};
      } else {
        node.floats["params"] = {1, -1, 2, -2};
      }
      checkpoints.add(run::encodeNodeCheckpoint(node));
    }
  }
  {
    Seeds metrics(root, "fuzz_metrics");
    const std::string consensus =
        R"({"event":"start","time":0.0004,"mode":"consensus","node":0,"model":"mlp hidden=8","parameters":100,"data":"synthetic","shard_samples":50,"rounds":3,"batch":8,"lr":0.05,"seed":1,"backup":"dynamic","staleness_bound":2,"neighbors":[1, 2]})"
        "\n"
        R"({"event":"round","time":0.1,"round":0,"loss":2.7,"lr":0.05,"backups":0,"wait_for":2,"used":2,"used_from":[1, 2],"compute_s":0.03,"wait_s":0.07,"bytes_sent":2822,"bytes_received":2822,"staleness_mean":0,"skipped":0,"timed_out":false})"
        "\n"
        R"({"event":"eval","time":0.2,"round":2,"test_loss":0.9,"test_accuracy":0.61})"
        "\n"
        R"({"event":"final","time":0.3,"test_loss":0.58,"test_accuracy":0.78,"rounds":3,"seconds":0.3,"time_to_target":-1,"finished_peers":[1, 2],"departed_peers":[],"average_accuracy":0.79})"
        "\n";
    const std::string ps =
        R"({"event":"start","time":0.001,"mode":"ps","node":1,"model":"softmax","parameters":30,"rounds":2,"staleness":"ssp:2","lr":0.05})"
        "\n"
        R"({"event":"clock","time":0.1,"clock":0,"loss":1.2,"wait_s":0.01,"bytes_sent":100,"bytes_received":90})"
        "\n";
    metrics.add(consensus);
    metrics.add(consensus + "~~~\n" + ps + "~~~\n" + consensus.substr(0, 300));
  }
}

// Scripts of fuzz_handshake (see its Script): full handshakes that succeed, with and without a
// secret, from both ends, so that the fuzzer starts past the proof.
void handshakeSeeds(const fs::path& root) {
  Seeds seeds(root, "fuzz_handshake");
  const std::string nonce(32, '\x11');
  // acceptor + secret: Hello (node 1, our cluster, a 32-byte nonce, the same run), valid Proof
  seeds.add(std::string("\x03\x01\x00\x01\x00\x00", 6) + nonce + "\x01\x02\x01");
  // acceptor, no secret: Hello without a nonce (length byte 40: 40 % 3 != 0, 40 % 40 == 0)
  seeds.add(std::string("\x01\x01\x00\x01\x00\x28", 6) + "\x01");
  // dialer + secret: valid Challenge, then Welcome from the dialed node
  seeds.add(std::string("\x02\x01\x01\x01", 4) + nonce + "\x01\x03\x01");
  // dialer, no secret: Welcome
  seeds.add(std::string("\x00\x01\x03\x01", 4));
}

void topologySeeds(const fs::path& root) {
  Seeds seeds(root, "fuzz_topology");
  for (auto kind : {topology::GraphKind::kRing, topology::GraphKind::kTorus,
                    topology::GraphKind::kComplete, topology::GraphKind::kStar}) {
    topology::GenerateOptions options;
    options.kind = kind;
    options.nodes = 4;
    options.mode =
        kind == topology::GraphKind::kStar ? topology::Mode::kPs : topology::Mode::kConsensus;
    seeds.add(topology::toToml(topology::generate(options).value()));
  }
}

}  // namespace

// fuzz_ps_messages: scripts of what PS workers send an owner (node 0 of 0, 1, 2; 6 keys of 4
// floats), written by the worker's own encoders (ps/codec.h): clocks, pulls, pushes with values
// inline or attached, a push of NaN, an impostor's INT64_MAX clock, peer events between them.
void psMessageSeeds(const fs::path& root) {
  Seeds seeds(root, "fuzz_ps_messages");
  const std::vector<node::NodeId> members{0, 1, 2};
  const ps::KeySpace space{ps::ChunkLayout{24, 4}};
  const std::vector<float> initial(space.total(), 0.5f);
  const std::vector<ps::Key> mine =
      ps::KeyStore(space, ps::ShardMap(members), 0, initial, ps::OwnerOptimizer{}).ownedKeys();
  auto record = [](node::NodeId from, ps::PsMessage message) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "fuzz", .sequence = 1};
    const std::string frame = bytesOf(ps::encodeFrame(header, std::move(message)));
    std::string out(1, static_cast<char>(from));
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    return out + frame;
  };
  auto event = [](node::NodeId from, int kind, int seconds) {
    return std::string(1, static_cast<char>(0x80 | (seconds << 4) | (kind << 2) | from));
  };
  const std::vector<float> grads(space.floatsOf(mine), 0.25f);
  const std::vector<float> nan(space.floatsOf(mine), std::nanf(""));
  auto push = [&](node::NodeId from, uint64_t id, ps::Clock clock, const std::vector<float>& g,
                  bool attach) {
    std::vector<std::span<const float>> rows;
    size_t at = 0;
    for (ps::Key key : mine) {
      const size_t n = space.floatsOf(std::span<const ps::Key>(&key, 1));
      rows.emplace_back(g.data() + at, n);
      at += n;
    }
    return record(from, ps::pushRequest(id, clock, mine, rows, g.size(), attach));
  };
  for (uint8_t options : {0, 1, 2}) {
    std::string script(1, static_cast<char>(options));
    for (ps::Clock c = 1; c <= 3; ++c) {
      for (node::NodeId w : {1u, 2u}) {
        script += record(w, ps::clockAnnouncement(c));
        script += record(w, ps::pullRequest(10 * c + w, c, c - 1, mine));
        script += push(w, 10 * c + w, c, grads, c % 2 == 0);
      }
    }
    script += event(2, 0, 3);  // node 2 down, its time-out passes
    script += record(1, ps::pullRequest(99, 4, 4, mine));
    script += event(2, 1, 0);
    seeds.add(script);
  }
  std::string attacks(1, '\0');
  attacks += record(1, ps::clockAnnouncement(1));
  attacks += push(1, 1, 1, nan, false);
  attacks += push(1, 2, 1, nan, true);
  attacks += record(2, ps::clockAnnouncement(INT64_MAX));
  attacks += record(2, ps::clockAnnouncement(21));
  attacks += record(1, ps::pullRequest(3, 1, INT64_MAX, mine));
  attacks += record(3, ps::clockAnnouncement(1));
  attacks += record(1, ps::clockAnnouncement(0));
  seeds.add(attacks);

  // Key runs (ps/key_runs.h) as a peer may send them: a run of 2^63 keys in 11 bytes, a run
  // past key 2^64 - 1, a varint cut off, keys and runs both, and a push naming more keys than
  // it has floats. Each must be refused, naming the peer, without sizing anything by it.
  auto rawPull = [&](uint64_t id, std::vector<uint8_t> runs, bool with_keys) {
    return record(1, ps::PsMessage{ps::wire::Body::PsPull,
                                   [=](flatbuffers::FlatBufferBuilder& b) {
                                     auto keys = with_keys ? b.CreateVector(mine) : 0;
                                     auto r = b.CreateVector(runs);
                                     return ps::wire::CreatePsPull(b, id, 1, 0, keys, r).Union();
                                   },
                                   0,
                                   {}});
  };
  std::vector<uint8_t> huge{0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  std::vector<uint8_t> past(9, 0xff);
  past.push_back(0x01);
  past.push_back(0x05);
  std::string runs(1, '\0');
  runs += record(1, ps::clockAnnouncement(1));
  runs += rawPull(1, huge, false);
  runs += rawPull(2, past, false);
  runs += rawPull(3, {0x02, 0x80}, false);
  runs += rawPull(4, {0x00, 0x00}, true);
  runs += rawPull(5, {0x00, 0x05}, false);  // keys 0-5: not all owned here
  runs += record(1, ps::PsMessage{ps::wire::Body::PsPush,
                                  [](flatbuffers::FlatBufferBuilder& b) {
                                    const std::vector<uint8_t> r{0x00, 0x05};
                                    const std::vector<float> one{1.0f};
                                    return ps::wire::CreatePsPush(b, 6, 1, 0, b.CreateVector(one),
                                                                  b.CreateVector(r))
                                        .Union();
                                  },
                                  0,
                                  {}});
  seeds.add(runs);

  // Slot runs (ps/key_runs.h SlotRun: table, slot, rows - 1 as varints) in every field that
  // carries them: a pull that asks want_slots, pulls and pushes by slots (good runs, a slot past
  // the store, a run of 2^32 rows, a varint cut off, a table that does not exist, slots and keys
  // both), and PsReplies with slot runs (an owner does not take replies: they are refused as
  // such). The store's layout starts at a random value per store, so a layout in a seed matches
  // only by chance: the owner decodes the runs first (decodeSlotRuns), then refuses the layout
  // as stale; the fuzzer reaches both.
  auto slotRuns = [](std::initializer_list<ps::SlotRun> named) {
    std::vector<uint8_t> out;
    const std::vector<ps::SlotRun> list(named);
    ps::encodeSlotRuns(list, out);
    return out;
  };
  const std::vector<uint8_t> first_two = slotRuns({{0, 0, 2}});
  const std::vector<uint8_t> past_store = slotRuns({{0, 1000, 1}});
  const std::vector<uint8_t> many_rows = slotRuns({{0, 0, 0xffffffffu}});
  const std::vector<uint8_t> no_table = slotRuns({{7, 0, 1}});
  const std::vector<uint8_t> twice = slotRuns({{0, 0, 1}, {0, 0, 1}});
  const std::vector<uint8_t> cut{0x00, 0x80};
  const std::vector<float> row_grads(8, 0.5f);
  const std::vector<std::span<const float>> pieces{std::span<const float>(row_grads)};
  std::string slots(1, '\0');
  slots += record(1, ps::clockAnnouncement(1));
  slots += record(1, ps::pullRequest(20, 1, 0, mine, true));
  for (uint64_t layout : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    slots += record(1, ps::pullBySlots(21, 1, 0, first_two, layout));
    slots += record(2, ps::pushBySlots(22, 1, first_two, layout, pieces));
  }
  for (const std::vector<uint8_t>* bad : {&past_store, &many_rows, &no_table, &twice, &cut}) {
    slots += record(1, ps::pullBySlots(23, 1, 0, *bad, 0));
    slots += record(2, ps::pushBySlots(24, 1, *bad, 0, pieces));
  }
  slots += record(
      1, ps::PsMessage{ps::wire::Body::PsPull,
                       [&](flatbuffers::FlatBufferBuilder& b) {
                         auto keys = b.CreateVector(mine);
                         auto r = b.CreateVector(first_two);
                         return ps::wire::CreatePsPull(b, 25, 1, 0, keys, 0, r, 0, true).Union();
                       },
                       0,
                       {}});
  const std::vector<std::span<const float>> reply_rows{std::span<const float>(row_grads)};
  slots += record(1, ps::pullReply(20, 0, reply_rows, row_grads.size(), first_two, 1));
  slots += record(2, ps::pullReply(26, 0, reply_rows, row_grads.size(), many_rows, 0));
  slots += record(1, ps::staleReply(21, ps::wire::PsOp::Pull, "stale"));
  seeds.add(slots);
}

// fuzz_consensus_messages: what neighbors send a consensus node (node 0 or 1 of 0..3, a
// softmax of 15 parameters in chunks of 4), written with consensus's own message writers: whole
// models of a few rounds chunk by chunk, one-float chunks of far rounds, a NaN model, Final
// models and partial sums for the end of the run, a ModelRequest and TrainingDone.
void consensusMessageSeeds(const fs::path& root) {
  using flatbuffers::FlatBufferBuilder;
  namespace cw = consensus::wire;
  Seeds seeds(root, "fuzz_consensus_messages");
  constexpr uint64_t kTotal = 15;
  constexpr uint64_t kChunk = 4;
  auto record = [](node::NodeId from, cw::Body kind, const node::BodyWriter& writer) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "fuzz", .sequence = 1};
    const std::string frame = bytesOf(node::encodeFrame(header, consensus::messageType(kind),
                                                        consensus::messageWriter(kind, writer)));
    std::string out(1, static_cast<char>(from));
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    return out + frame;
  };
  auto share = [&](node::NodeId from, int64_t round, uint64_t offset, std::vector<float> values,
                   cw::SharePurpose purpose, std::vector<uint32_t> models = {}) {
    return record(from, cw::Body::ModelShare, [=](FlatBufferBuilder& b) {
      auto v = b.CreateVector(values);
      flatbuffers::Offset<flatbuffers::Vector<uint32_t>> m;
      if (!models.empty()) m = b.CreateVector(models);
      cw::ModelShareBuilder s(b);
      s.add_round(round);
      s.add_offset(offset);
      s.add_total(kTotal);
      s.add_backups(1);
      s.add_values(v);
      s.add_purpose(purpose);
      if (!models.empty()) s.add_models(m);
      return s.Finish().Union();
    });
  };
  auto model = [&](node::NodeId from, int64_t round, float value, cw::SharePurpose purpose,
                   std::vector<uint32_t> models = {}) {
    std::string out;
    for (uint64_t at = 0; at < kTotal; at += kChunk) {
      const size_t n = std::min(kChunk, kTotal - at);
      out += share(from, round, at, std::vector<float>(n, value), purpose, models);
    }
    return out;
  };
  const std::string gossip = std::string(1, '\0') + model(1, 0, 0.5f, cw::SharePurpose::Gossip) +
                             model(2, 0, 0.25f, cw::SharePurpose::Gossip) +
                             model(1, 1, 0.5f, cw::SharePurpose::Gossip);
  seeds.add(gossip);
  std::string far(1, '\x04');  // tau 2
  for (int64_t round = 0; round < 30; ++round)
    far += share(2, round * 7, round % 4, {0.5f}, cw::SharePurpose::Gossip);
  seeds.add(far);
  std::string poisoned(1, '\0');
  poisoned += model(1, 2, std::nanf(""), cw::SharePurpose::Gossip);
  poisoned += share(3, 0, 0, {1.0f, 2.0f}, cw::SharePurpose::Gossip);  // not a neighbor of 0
  seeds.add(poisoned);
  std::string end(1, '\0');
  end += model(1, 19, 0.5f, cw::SharePurpose::Final);
  end += model(2, 19, 0.5f, cw::SharePurpose::PartialSum, {2});
  end += model(1, 19, 1.5f, cw::SharePurpose::PartialSum, {1, 3});
  end += record(1, cw::Body::TrainingDone,
                [](FlatBufferBuilder& b) { return cw::CreateTrainingDone(b, 20).Union(); });
  end += record(2, cw::Body::ModelRequest, [](FlatBufferBuilder& b) {
    return cw::CreateModelRequest(b, b.CreateString("rejoin")).Union();
  });
  seeds.add(end);
  // Node 1 (option bit 0), whose neighbors are 0, 2 and 3, and a catch-up model.
  std::string other(1, '\x03');
  other +=
      model(3, 0, 0.5f, cw::SharePurpose::Gossip) + model(0, 0, 0.5f, cw::SharePurpose::Catchup);
  other += model(3, 19, 0.5f, cw::SharePurpose::PartialSum, {3});
  seeds.add(other);
}

// fuzz_sparse_consensus_messages: RowShares of the harness's model (matrix factorization, two
// tables of 6 and 5 rows of 2 floats) as neighbors send node 0 or 1, written with consensus's
// own message writer: shares of a few rounds in parts, an empty share, a catch-up share nobody
// asked for, a NaN row, rows out of order, and ModelRequest and TrainingDone.
void sparseConsensusSeeds(const fs::path& root) {
  using flatbuffers::FlatBufferBuilder;
  namespace cw = consensus::wire;
  Seeds seeds(root, "fuzz_sparse_consensus_messages");
  auto record = [](node::NodeId from, cw::Body kind, const node::BodyWriter& writer) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "fuzz", .sequence = 1};
    const std::string frame = bytesOf(node::encodeFrame(header, consensus::messageType(kind),
                                                        consensus::messageWriter(kind, writer)));
    std::string out(1, static_cast<char>(from));
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    return out + frame;
  };
  struct Block {
    uint32_t table;
    std::vector<uint64_t> keys;
    float value;
  };
  auto part = [&](node::NodeId from, int64_t round, uint32_t index, uint32_t parts,
                  std::vector<Block> blocks, bool catchup = false) {
    return record(from, cw::Body::RowShare, [=](FlatBufferBuilder& b) {
      std::vector<flatbuffers::Offset<cw::RowBlock>> written;
      for (const Block& block : blocks) {
        const std::vector<float> values(block.keys.size() * 2, block.value);
        const std::vector<uint8_t> hops(block.keys.size(), 1);
        auto k = b.CreateVector(block.keys);
        auto v = b.CreateVector(values);
        auto h = b.CreateVector(hops);
        written.push_back(cw::CreateRowBlock(b, block.table, k, v, h));
      }
      auto list = b.CreateVector(written);
      return cw::CreateRowShare(b, round, index, parts, 1, list, catchup).Union();
    });
  };
  std::string gossip(1, '\0');
  for (int64_t round = 0; round < 3; ++round) {
    for (node::NodeId from : {1u, 2u}) {
      gossip += part(from, round, 0, 2, {{0, {0, 2, 5}, 0.5f}});
      gossip += part(from, round, 1, 2, {{0, {1}, 0.25f}, {1, {0, 4}, -0.5f}});
    }
  }
  gossip += part(1, 3, 0, 1, {});  // an empty share: "round 3 arrived"
  seeds.add(gossip);
  std::string attacks(1, '\x02');
  attacks += part(1, 0, 0, 1, {{0, {0, 1}, std::nanf("")}});
  attacks += part(2, 0, 0, 1, {{1, {3, 1}, 1.0f}});               // keys out of order
  attacks += part(2, 1, 0, 1, {{0, {9}, 1.0f}});                  // beyond the table's rows
  attacks += part(1, 1, 0, 1, {{1, {0}, 1.0f}, {0, {0}, 1.0f}});  // tables out of order
  attacks += part(3, 0, 0, 1, {{0, {0}, 1.0f}});                  // not a neighbor of node 0
  attacks += part(1, 2, 0, 1, {{0, {0}, 1.0f}}, true);            // a catch-up nobody asked for
  attacks += part(2, 2, 1, 3, {{0, {0}, 1.0f}});                  // part 1 before part 0
  attacks += part(1, INT64_MAX, 0, 1, {});
  attacks += record(1, cw::Body::TrainingDone,
                    [](FlatBufferBuilder& b) { return cw::CreateTrainingDone(b, 20).Union(); });
  attacks += record(2, cw::Body::ModelRequest, [](FlatBufferBuilder& b) {
    return cw::CreateModelRequest(b, b.CreateString("rejoin")).Union();
  });
  seeds.add(attacks);
  // Node 1, whose neighbors are 0, 2 and 3.
  std::string other(1, '\x01');
  other += part(3, 0, 0, 1, {{0, {0, 1, 2, 3, 4, 5}, 0.5f}, {1, {0, 1, 2, 3, 4}, 0.5f}});
  other += part(0, 0, 0, 1, {{1, {2}, 0.75f}});
  seeds.add(other);
}

// fuzz_replica_messages: the replica sync of the harness's layout (members 0, 1, 2; hot keys 0..5
// of 2 floats and 6..7 of 3) as members 1 and 2 would run round 1 with node 0, written with the
// replica codec: each member's contribution to node 0's part, their sums of their own parts, the
// drain announcements; and a round far ahead, a stranger's message, a member down.
void replicaSeeds(const fs::path& root) {
  Seeds seeds(root, "fuzz_replica_messages");
  const std::vector<node::NodeId> members{0, 1, 2};
  ps::KeySpace space;
  space.addTable("pairs", 0, 6, 2);
  space.addTable("triples", 6, 2, 3);
  const ps::ReplicaLayout layout(space, space.allKeys(), ps::ShardMap(members));
  auto rowsOf = [&](size_t part, float value) {
    auto rows = std::make_shared<ps::SparseRows>();
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout.part(i) != part) continue;
      rows->keys.push_back(layout.keys()[i]);
      rows->values.insert(rows->values.end(), layout.width(i), value);
    }
    return rows;
  };
  auto record = [](node::NodeId from, ps::ReplicaFrameParts parts) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "fuzz", .sequence = 1};
    const std::string frame = bytesOf(ps::encodeReplicaFrame(header, std::move(parts)));
    std::string out(1, static_cast<char>(from));
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    return out + frame;
  };
  auto sync = [&](node::NodeId from, ps::ReplicaSyncKind kind, uint64_t round, node::NodeId part,
                  std::vector<node::NodeId> contributors, float value) {
    ps::ReplicaSyncMessage message;
    message.kind = kind;
    message.round = round;
    message.part = part;
    message.contributors = std::move(contributors);
    message.rows = rowsOf(part, value);
    return record(from, ps::replicaSyncFrame(message));
  };
  using Kind = ps::ReplicaSyncKind;
  for (char options : {'\0', '\1'}) {
    std::string round(1, options);
    round += sync(1, Kind::kContribution, 1, 0, {}, 0.5f);
    round += sync(2, Kind::kContribution, 1, 0, {}, -0.25f);
    round += sync(1, Kind::kSum, 1, 1, {0, 1, 2}, 0.125f);
    round += sync(2, Kind::kSum, 1, 2, {0, 1, 2}, 0.75f);
    round += record(1, ps::replicaDrainFrame(2));
    round += sync(1, Kind::kContribution, 2, 0, {}, 1.0f);
    round += record(2, ps::replicaDrainFrame(2));
    seeds.add(round);
  }
  std::string attacks(1, '\0');
  attacks += sync(1, Kind::kContribution, UINT64_MAX, 0, {}, 1.0f);
  attacks += sync(3, Kind::kContribution, 1, 0, {}, 1.0f);  // a stranger
  attacks += sync(2, Kind::kSum, 1, 0, {2}, 1.0f);          // a sum of a part not its own
  attacks += record(1, ps::replicaDrainFrame(0));
  attacks += std::string(1, static_cast<char>(0x80 | 2));  // member 2 down
  attacks += sync(1, Kind::kContribution, 1, 0, {}, std::nanf(""));
  attacks += sync(2, Kind::kContribution, 1, 0, {}, 1.0f);  // from a member that is down
  seeds.add(attacks);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  fs::path root = argv[1];
  frameSeeds(root);
  fileSeeds(root);
  topologySeeds(root);
  handshakeSeeds(root);
  psMessageSeeds(root);
  consensusMessageSeeds(root);
  sparseConsensusSeeds(root);
  replicaSeeds(root);
  return 0;
}
