// The run spec that launch and compare hand their nodes: every setting survives the trip, and a
// file that is not a spec of this build is refused naming the file.
#include "cli/run_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace chorus::cli {
namespace {

namespace fs = std::filesystem;

// Every setting a flag of `chorus node` can set, each away from its default.
NodeArgs everySettingChanged() {
  NodeArgs a;
  a.topology = "lab.toml";
  a.mode = "ps";
  a.log_level = "debug";
  a.ready_timeout_s = 61.5;
  a.pings = 9;
  a.payload_bytes = 4097;
  a.ping_timeout_s = 31.5;
  a.linger_s = 0.25;
  a.heartbeat_ms = 250;
  a.write_slice_packets = 7;
  a.peer_timeout_ms = 9000;
  a.max_frame_mib = 64;
  a.secret_file = "secret.key";
  a.link_delay = faults::LinkDelay::read("20,5").value();
  a.link_loss = faults::LinkLoss::read("0.01,300").value();
  run::RunOptions& r = a.run;
  r.data.name = "synthetic";
  r.data.dataDir = "/data";
  r.data.syntheticTrain = 1234;
  r.data.syntheticTest = 567;
  r.data.normalize = false;
  r.train_limit = 999;
  r.model.name = "mlp";
  r.model.hidden = {64, 32, 16};
  r.model.dropout = 0.25f;
  r.shard = run::ShardSpec::read("dirichlet:0.5").value();
  r.rounds = 77;
  r.epochs = 3.5;
  r.batch = 17;
  r.lr = 0.125;
  r.momentum = 0.5;
  r.nesterov = true;
  r.weight_decay = 1e-4;
  r.schedule = "step";
  r.warmup_epochs = 0.5;
  r.step_epochs = 2;
  r.gamma = 0.3;
  r.augment = true;
  r.crop_padding = 2;
  r.flip = false;
  r.seed = 42;
  r.stragglers = chorus::faults::StragglerProfile::read("fixed:3+slow:1=2").value();
  r.eval_every = 5;
  r.target_acc = 0.9;
  r.out_dir = "runs/x";
  r.save_path = "model.ckpt";
  r.resume_path = "old.ckpt";
  r.confusion = true;
  r.checkpoint_every = 25;
  r.checkpoint_dir = "runs/cuts";
  a.staleness = run::StalenessBound{run::StalenessBound::kInfinite};
  a.consensus.rejoin = true;
  a.consensus.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
  a.consensus.mixing = "metropolis";
  a.consensus.chunk_floats = 4096;
  a.consensus.skip_gap = 3;
  a.ps.key_floats = 100;
  a.ps.down_timeout_s = 2.5;
  a.ps.cache = false;
  a.ps.owner_momentum = "push";
  a.ps.async_rounds = "worker";
  a.ps.async_rounds_given = true;
  a.ps.bandwidth_mbps = 250.5;
  SparseFlags& f = a.sparse.flags;
  f.reg = "l2";
  f.regWeight = 0.05;
  f.optimizer = "sgd";
  f.initScale = 0.2;
  f.mf.rank = 8;
  f.mf.reg = 0.01;
  f.mf.optimizer = "sgd";
  f.mf.learningRate = 0.3;
  f.mf.batchSize = 77;
  f.mf.epochs = 4;
  f.mf.initStd = 0.05;
  f.mf.globalMean = false;
  f.mf.seed = 9;
  f.mf.metricsPath = "mf.jsonl";
  f.mf.logEverySteps = 33;
  f.mf.targetRatio = 1.2;
  f.zipf.rows = 11;
  f.zipf.cols = 12;
  f.zipf.cells = 13;
  f.zipf.testShare = 0.2;
  f.zipf.rank = 3;
  f.zipf.rowExponent = 1.3;
  f.zipf.colExponent = 0.9;
  f.zipf.noiseSigma = 0.1;
  f.zipf.seed = 5;
  f.zipf.memoryLimitBytes = 1 << 20;
  f.dataFile = "ratings.csv";
  f.writeData = "out";
  f.kge.model = ml::KgeModelKind::kDistMult;
  f.kge.dim = 64;
  f.kge.negatives = 99;
  f.kge.allNegatives = true;
  f.kge.sharedNegatives = true;
  f.kge.loss = ml::KgeLossKind::kCrossEntropy;
  f.kge.adversarialTemperature = 0.5;
  f.kge.regularizer = ml::KgeRegularizerKind::kL2;
  f.kge.regWeight = 0.02;
  f.kge.initScale = 0.01;
  f.kge.reciprocal = true;
  f.negatives = "all";
  f.loss = "ce";
  f.evalEvery = 3;
  f.timeLimit = 60;
  f.keepBest = true;
  f.adagradInitial = 0.1;
  a.sparse.logEvery = 7;
  a.sparse.sampleScheme = "pool";
  a.sparse.sampleReuse = 4;
  a.sparse.technique = "nups";
  a.sparse.replicate = 900;
  a.sparse.replicaBytes = 12345;
  a.sparse.replicaSyncsPerSecond = 7.5;
  a.sparse.mfSchedule = "rotation";
  a.sparse.gossip.cold_every = 3;
  a.sparse.gossip.round_bytes = 12345;
  a.sparse.gossip.hot_bytes = 777;
  a.sparse.gossip.relay_hops = 5;
  a.sparse.gossip.dense_exchange = true;
  a.sparse.given = {"--batch", "--lr"};
  return a;
}

void expectSameSettings(const NodeArgs& a, const NodeArgs& b) {
  EXPECT_EQ(a.topology, b.topology);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.ready_timeout_s, b.ready_timeout_s);
  EXPECT_EQ(a.pings, b.pings);
  EXPECT_EQ(a.payload_bytes, b.payload_bytes);
  EXPECT_EQ(a.ping_timeout_s, b.ping_timeout_s);
  EXPECT_EQ(a.linger_s, b.linger_s);
  EXPECT_EQ(a.heartbeat_ms, b.heartbeat_ms);
  EXPECT_EQ(a.write_slice_packets, b.write_slice_packets);
  EXPECT_EQ(a.peer_timeout_ms, b.peer_timeout_ms);
  EXPECT_EQ(a.max_frame_mib, b.max_frame_mib);
  EXPECT_EQ(a.secret_file, b.secret_file);
  EXPECT_EQ(a.link_delay, b.link_delay);
  EXPECT_EQ(a.link_loss, b.link_loss);
  const run::RunOptions &r = a.run, &s = b.run;
  EXPECT_EQ(r.data.name, s.data.name);
  EXPECT_EQ(r.data.dataDir, s.data.dataDir);
  EXPECT_EQ(r.data.syntheticTrain, s.data.syntheticTrain);
  EXPECT_EQ(r.data.syntheticTest, s.data.syntheticTest);
  EXPECT_EQ(r.data.normalize, s.data.normalize);
  EXPECT_EQ(r.train_limit, s.train_limit);
  EXPECT_EQ(r.model.name, s.model.name);
  EXPECT_EQ(r.model.hidden, s.model.hidden);
  EXPECT_EQ(r.model.dropout, s.model.dropout);
  EXPECT_EQ(r.shard, s.shard);
  EXPECT_EQ(r.rounds, s.rounds);
  EXPECT_EQ(r.epochs, s.epochs);
  EXPECT_EQ(r.batch, s.batch);
  EXPECT_EQ(r.lr, s.lr);
  EXPECT_EQ(r.momentum, s.momentum);
  EXPECT_EQ(r.nesterov, s.nesterov);
  EXPECT_EQ(r.weight_decay, s.weight_decay);
  EXPECT_EQ(r.schedule, s.schedule);
  EXPECT_EQ(r.warmup_epochs, s.warmup_epochs);
  EXPECT_EQ(r.step_epochs, s.step_epochs);
  EXPECT_EQ(r.gamma, s.gamma);
  EXPECT_EQ(r.augment, s.augment);
  EXPECT_EQ(r.crop_padding, s.crop_padding);
  EXPECT_EQ(r.flip, s.flip);
  EXPECT_EQ(r.seed, s.seed);
  EXPECT_EQ(r.stragglers, s.stragglers);
  EXPECT_EQ(r.eval_every, s.eval_every);
  EXPECT_EQ(r.target_acc, s.target_acc);
  EXPECT_EQ(r.out_dir, s.out_dir);
  EXPECT_EQ(r.save_path, s.save_path);
  EXPECT_EQ(r.resume_path, s.resume_path);
  EXPECT_EQ(r.confusion, s.confusion);
  EXPECT_EQ(r.checkpoint_every, s.checkpoint_every);
  EXPECT_EQ(r.checkpoint_dir, s.checkpoint_dir);
  EXPECT_EQ(a.staleness, b.staleness);
  EXPECT_EQ(a.consensus.rejoin, b.consensus.rejoin);
  EXPECT_EQ(a.consensus.backup, b.consensus.backup);
  EXPECT_EQ(a.consensus.mixing, b.consensus.mixing);
  EXPECT_EQ(a.consensus.chunk_floats, b.consensus.chunk_floats);
  EXPECT_EQ(a.consensus.skip_gap, b.consensus.skip_gap);
  EXPECT_EQ(a.ps.key_floats, b.ps.key_floats);
  EXPECT_EQ(a.ps.down_timeout_s, b.ps.down_timeout_s);
  EXPECT_EQ(a.ps.cache, b.ps.cache);
  EXPECT_EQ(a.ps.owner_momentum, b.ps.owner_momentum);
  EXPECT_EQ(a.ps.async_rounds, b.ps.async_rounds);
  EXPECT_EQ(a.ps.async_rounds_given, b.ps.async_rounds_given);
  EXPECT_EQ(a.ps.bandwidth_mbps, b.ps.bandwidth_mbps);
  const SparseFlags &f = a.sparse.flags, &g = b.sparse.flags;
  EXPECT_EQ(f.reg, g.reg);
  EXPECT_EQ(f.regWeight, g.regWeight);
  EXPECT_EQ(f.optimizer, g.optimizer);
  EXPECT_EQ(f.initScale, g.initScale);
  EXPECT_EQ(f.mf.rank, g.mf.rank);
  EXPECT_EQ(f.mf.reg, g.mf.reg);
  EXPECT_EQ(f.mf.optimizer, g.mf.optimizer);
  EXPECT_EQ(f.mf.learningRate, g.mf.learningRate);
  EXPECT_EQ(f.mf.batchSize, g.mf.batchSize);
  EXPECT_EQ(f.mf.epochs, g.mf.epochs);
  EXPECT_EQ(f.mf.initStd, g.mf.initStd);
  EXPECT_EQ(f.mf.globalMean, g.mf.globalMean);
  EXPECT_EQ(f.mf.seed, g.mf.seed);
  EXPECT_EQ(f.mf.metricsPath, g.mf.metricsPath);
  EXPECT_EQ(f.mf.logEverySteps, g.mf.logEverySteps);
  EXPECT_EQ(f.mf.targetRatio, g.mf.targetRatio);
  EXPECT_EQ(f.zipf.rows, g.zipf.rows);
  EXPECT_EQ(f.zipf.cols, g.zipf.cols);
  EXPECT_EQ(f.zipf.cells, g.zipf.cells);
  EXPECT_EQ(f.zipf.testShare, g.zipf.testShare);
  EXPECT_EQ(f.zipf.rank, g.zipf.rank);
  EXPECT_EQ(f.zipf.rowExponent, g.zipf.rowExponent);
  EXPECT_EQ(f.zipf.colExponent, g.zipf.colExponent);
  EXPECT_EQ(f.zipf.noiseSigma, g.zipf.noiseSigma);
  EXPECT_EQ(f.zipf.seed, g.zipf.seed);
  EXPECT_EQ(f.zipf.memoryLimitBytes, g.zipf.memoryLimitBytes);
  EXPECT_EQ(f.dataFile, g.dataFile);
  EXPECT_EQ(f.writeData, g.writeData);
  EXPECT_EQ(f.kge.model, g.kge.model);
  EXPECT_EQ(f.kge.dim, g.kge.dim);
  EXPECT_EQ(f.kge.negatives, g.kge.negatives);
  EXPECT_EQ(f.kge.allNegatives, g.kge.allNegatives);
  EXPECT_EQ(f.kge.sharedNegatives, g.kge.sharedNegatives);
  EXPECT_EQ(f.kge.loss, g.kge.loss);
  EXPECT_EQ(f.kge.adversarialTemperature, g.kge.adversarialTemperature);
  EXPECT_EQ(f.kge.regularizer, g.kge.regularizer);
  EXPECT_EQ(f.kge.regWeight, g.kge.regWeight);
  EXPECT_EQ(f.kge.initScale, g.kge.initScale);
  EXPECT_EQ(f.kge.reciprocal, g.kge.reciprocal);
  EXPECT_EQ(f.negatives, g.negatives);
  EXPECT_EQ(f.loss, g.loss);
  EXPECT_EQ(f.evalEvery, g.evalEvery);
  EXPECT_EQ(f.timeLimit, g.timeLimit);
  EXPECT_EQ(f.keepBest, g.keepBest);
  EXPECT_EQ(f.adagradInitial, g.adagradInitial);
  EXPECT_EQ(a.sparse.logEvery, b.sparse.logEvery);
  EXPECT_EQ(a.sparse.sampleScheme, b.sparse.sampleScheme);
  EXPECT_EQ(a.sparse.sampleReuse, b.sparse.sampleReuse);
  EXPECT_EQ(a.sparse.technique, b.sparse.technique);
  EXPECT_EQ(a.sparse.replicate, b.sparse.replicate);
  EXPECT_EQ(a.sparse.replicaBytes, b.sparse.replicaBytes);
  EXPECT_EQ(a.sparse.replicaSyncsPerSecond, b.sparse.replicaSyncsPerSecond);
  EXPECT_EQ(a.sparse.mfSchedule, b.sparse.mfSchedule);
  EXPECT_EQ(a.sparse.gossip.cold_every, b.sparse.gossip.cold_every);
  EXPECT_EQ(a.sparse.gossip.round_bytes, b.sparse.gossip.round_bytes);
  EXPECT_EQ(a.sparse.gossip.hot_bytes, b.sparse.gossip.hot_bytes);
  EXPECT_EQ(a.sparse.gossip.relay_hops, b.sparse.gossip.relay_hops);
  EXPECT_EQ(a.sparse.gossip.dense_exchange, b.sparse.gossip.dense_exchange);
  EXPECT_EQ(a.sparse.given, b.sparse.given);
}

TEST(RunSpec, EverySettingSurvivesTheTrip) {
  for (const NodeArgs& args : {NodeArgs{}, everySettingChanged()}) {
    const std::vector<uint8_t> bytes = encodeRunSpec(args);
    const NodeArgs back = decodeRunSpec(bytes, "test").value();
    expectSameSettings(args, back);
    EXPECT_FALSE(back.id.has_value());
  }
}

// The modes take the one --staleness and the one --rejoin.
TEST(RunSpec, TheModesTakeTheSharedBoundAndRejoin) {
  NodeArgs args;
  args.staleness = run::StalenessBound{5};
  args.consensus.rejoin = true;
  EXPECT_EQ(args.psOptions().staleness.bound, 5);
  EXPECT_TRUE(args.psOptions().rejoin);
  EXPECT_EQ(args.consensusOptions().staleness.bound, 5);
}

class RunSpecFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("run-spec-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string refusal(const fs::path& path) {
    const node::Result<NodeArgs> read = readRunSpec(path.string());
    if (read.ok()) ADD_FAILURE() << path << " was accepted";
    return read.message();
  }
  fs::path dir_;
};

TEST_F(RunSpecFile, WrittenAndReadBack) {
  const fs::path path = dir_ / "run.spec";
  ASSERT_TRUE(writeRunSpec(everySettingChanged(), path.string()).ok());
  expectSameSettings(everySettingChanged(), readRunSpec(path.string()).value());
  EXPECT_FALSE(fs::exists(dir_ / "run.spec.partial"));
}

TEST_F(RunSpecFile, AnUnusableFileIsRefusedNamingIt) {
  const fs::path missing = dir_ / "missing.spec";
  EXPECT_NE(refusal(missing).find("--spec " + missing.string() + ": cannot read it"),
            std::string::npos);

  const fs::path text = dir_ / "text.spec";
  std::ofstream(text) << "--lr 0.1 --rounds 5\n";
  EXPECT_NE(refusal(text).find(text.string() + ": not a chorus run spec"), std::string::npos);

  // A spec cut short: the identifier is there, the Verifier refuses the rest.
  std::vector<uint8_t> bytes = encodeRunSpec(everySettingChanged());
  const fs::path cut = dir_ / "cut.spec";
  std::ofstream(cut, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(24));
  const std::string cut_refusal = refusal(cut);
  EXPECT_NE(cut_refusal.find(cut.string()), std::string::npos) << cut_refusal;

  // A stale spec, of another build's version.
  bytes = encodeRunSpec(everySettingChanged(), kRunSpecVersion + 1);
  const fs::path stale = dir_ / "stale.spec";
  std::ofstream(stale, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const std::string stale_refusal = refusal(stale);
  EXPECT_NE(stale_refusal.find(stale.string() + ": a run spec of version " +
                               std::to_string(kRunSpecVersion + 1)),
            std::string::npos)
      << stale_refusal;
  EXPECT_NE(stale_refusal.find("write it again with `chorus launch`"), std::string::npos);

  // A spec of version 3, which carried the straggler profile, the backup rule and the link
  // faults as text for the child to parse again: refused by its version, before any field is
  // read.
  bytes = encodeRunSpec(everySettingChanged(), 3);
  const fs::path old = dir_ / "old.spec";
  std::ofstream(old, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const std::string old_refusal = refusal(old);
  EXPECT_NE(old_refusal.find(old.string() +
                             ": a run spec of version 3, and this chorus reads "
                             "version " +
                             std::to_string(kRunSpecVersion)),
            std::string::npos)
      << old_refusal;
}

// The shard travels typed (its kind and alpha, parsed once where --shard was read); a spec whose
// shard --shard could not have given is refused naming the spec, not used.
TEST(RunSpec, AShardNoFlagGivesIsRefused) {
  NodeArgs args = everySettingChanged();
  const NodeArgs back = decodeRunSpec(encodeRunSpec(args), "test").value();
  EXPECT_EQ(back.run.shard.kind, run::ShardSpec::Kind::kDirichlet);
  EXPECT_DOUBLE_EQ(back.run.shard.alpha, 0.5);
  args.run.shard.alpha = -1;
  const node::Result<NodeArgs> bad = decodeRunSpec(encodeRunSpec(args), "bad.spec");
  ASSERT_FALSE(bad.ok()) << "a shard with alpha -1 was accepted";
  EXPECT_NE(bad.message().find("bad.spec: a shard of kind 1 with alpha -1"), std::string::npos)
      << bad.message();
}

// The straggler profile, the backup rule and the link faults travel typed (issue 23, item 3):
// the child reads their values, parses no grammar, and checks them against the same limits the
// flags have, so a spec holding values no flag gives (a damaged file) is refused naming it.
TEST(RunSpec, TypedFaultsAndRulesNoFlagGivesAreRefused) {
  const NodeArgs good = everySettingChanged();
  const NodeArgs back = decodeRunSpec(encodeRunSpec(good), "test").value();
  ASSERT_EQ(back.run.stragglers.terms.size(), 2u);
  EXPECT_EQ(back.run.stragglers.terms[1].factors.at(1), 2.0);
  EXPECT_EQ(back.run.stragglers.text, "fixed:3+slow:1=2");
  EXPECT_EQ(back.consensus.backup.kind, consensus::BackupRuleSpec::Kind::kStatic);
  EXPECT_EQ(back.consensus.backup.value, 1.0);
  EXPECT_EQ(back.link_delay.delay, std::chrono::milliseconds(20));
  EXPECT_EQ(back.link_delay.jitter, std::chrono::milliseconds(5));
  EXPECT_EQ(back.link_loss.rto, std::chrono::milliseconds(300));

  const auto refusal = [](const NodeArgs& args) {
    const node::Result<NodeArgs> read = decodeRunSpec(encodeRunSpec(args), "bad.spec");
    if (read.ok()) ADD_FAILURE() << "accepted";
    return read.message();
  };
  NodeArgs args = good;
  args.run.stragglers.terms[1].factors[1] = 0.5;  // slow:1=0.5: faster, which no term gives
  std::string why = refusal(args);
  EXPECT_NE(why.find("bad.spec: its straggler profile is not one --stragglers gives"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("FACTOR 0.5 must be >= 1"), std::string::npos) << why;

  args = good;
  args.run.stragglers.terms.push_back(faults::StragglerProfile::read("crash:2@3").value().terms[0]);
  args.run.stragglers.terms.push_back(args.run.stragglers.terms.back());
  why = refusal(args);
  EXPECT_NE(why.find("node 2 is given two crash steps"), std::string::npos) << why;

  args = good;
  args.consensus.backup.value = 1.5;  // static:1.5
  why = refusal(args);
  EXPECT_NE(why.find("bad.spec: its backup rule is not one --backup gives"), std::string::npos)
      << why;

  args = good;
  args.link_delay.delay = std::chrono::hours(1);
  why = refusal(args);
  EXPECT_NE(why.find("bad.spec: its link faults are not ones --link-delay and --link-loss give"),
            std::string::npos)
      << why;

  args = good;
  args.link_loss.probability = 0.9;
  why = refusal(args);
  EXPECT_NE(why.find("P 0.9 is outside 0..0.5"), std::string::npos) << why;
}

}  // namespace
}  // namespace chorus::cli
