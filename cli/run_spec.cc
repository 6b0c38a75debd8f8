#include "cli/run_spec.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "chorus/run_spec_generated.h"

namespace chorus::cli {

ps::PsOptions NodeArgs::psOptions() const {
  ps::PsOptions options = ps;
  options.staleness = staleness;
  options.rejoin = consensus.rejoin;
  return options;
}

consensus::ConsensusOptions NodeArgs::consensusOptions() const {
  consensus::ConsensusOptions options = consensus;
  options.staleness = staleness;
  return options;
}

namespace {

namespace fb = chorus::spec;

// Every field a flag of `chorus node` can set travels in the spec. A field added to NodeArgs or
// the option structs it holds changes their size and stops the build here: carry it in
// run_spec.fbs, encodeRunSpec() and decodeRunSpec() (and the round-trip test), then update the
// size. (The test hooks of the mode options, std::function members, are not settings.)
static_assert(sizeof(void*) != 8 || sizeof(NodeArgs) == 2104,
              "NodeArgs changed: carry the new setting in the run spec (cli/run_spec.fbs)");

std::string text(const flatbuffers::String* s) {
  return s == nullptr ? std::string() : s->str();
}

// The spec's shard, checked as --shard checks it (a spec is a file: it may be damaged).
node::Result<run::ShardSpec> shardOf(const fb::Shard* s, const std::string& source) {
  run::ShardSpec shard;
  if (s == nullptr || s->kind() == 0) return shard;
  if (s->kind() != 1 || !(s->alpha() > 0 && s->alpha() <= run::ShardSpec::kMaxDirichletAlpha)) {
    return node::invalidInput(
        fmt::format("{}: a shard of kind {} with alpha {} is not one --shard "
                    "gives; write the spec again with chorus launch",
                    source, s->kind(), s->alpha()));
  }
  shard.kind = run::ShardSpec::Kind::kDirichlet;
  shard.alpha = s->alpha();
  return shard;
}

flatbuffers::Offset<fb::Stragglers> encodeStragglers(flatbuffers::FlatBufferBuilder& b,
                                                     const faults::StragglerProfile& profile) {
  std::vector<flatbuffers::Offset<fb::StragglerTerm>> terms;
  for (const faults::StragglerTerm& t : profile.terms) {
    std::vector<uint32_t> nodes;
    std::vector<double> factors;
    std::vector<int64_t> steps;
    for (const auto& [id, factor] : t.factors) {
      nodes.push_back(id);
      factors.push_back(factor);
    }
    for (const auto& [id, step] : t.crash_steps) {
      nodes.push_back(id);
      steps.push_back(step);
    }
    terms.push_back(fb::CreateStragglerTermDirect(b, static_cast<uint8_t>(t.kind), t.a, t.b, t.c,
                                                  &nodes, &factors, &steps));
  }
  return fb::CreateStragglersDirect(b, profile.text.c_str(), &terms);
}

// The spec's straggler profile, every term checked as --stragglers checks it.
node::Result<faults::StragglerProfile> stragglersOf(const fb::Stragglers* s) {
  if (s == nullptr) return faults::StragglerProfile{};
  std::vector<faults::StragglerTerm> terms;
  if (s->terms() != nullptr) {
    for (const fb::StragglerTerm* t : *s->terms()) {
      faults::StragglerTerm term;
      if (t->kind() > static_cast<uint8_t>(faults::StragglerTerm::Kind::kCrash)) {
        return node::invalidInput(fmt::format("a straggler term of kind {}", t->kind()));
      }
      term.kind = static_cast<faults::StragglerTerm::Kind>(t->kind());
      term.a = t->a();
      term.b = t->b();
      term.c = t->c();
      const size_t nodes = t->nodes() == nullptr ? 0 : t->nodes()->size();
      const size_t factors = t->factors() == nullptr ? 0 : t->factors()->size();
      const size_t steps = t->steps() == nullptr ? 0 : t->steps()->size();
      if (factors + steps != nodes || (factors > 0 && steps > 0)) {
        return node::invalidInput(
            fmt::format("a straggler term with {} node(s) for {} factor(s) and {} step(s)", nodes,
                        factors, steps));
      }
      for (size_t i = 0; i < nodes; ++i) {
        const uint32_t id = t->nodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
        const bool fresh =
            factors > 0
                ? term.factors
                      .emplace(id, t->factors()->Get(static_cast<flatbuffers::uoffset_t>(i)))
                      .second
                : term.crash_steps
                      .emplace(id, t->steps()->Get(static_cast<flatbuffers::uoffset_t>(i)))
                      .second;
        if (!fresh)
          return node::invalidInput(fmt::format("a straggler term names node {} twice", id));
      }
      terms.push_back(std::move(term));
    }
  }
  return faults::StragglerProfile::fromTerms(std::move(terms), text(s->text()));
}

// The spec's link faults, checked against the runtime's limits as the flags are.
node::Status linkFaultsOf(const fb::LinkFaults* l, NodeArgs& a) {
  if (l == nullptr) return node::Status();
  node::Result<faults::LinkDelay> delay = faults::LinkDelay::fromValues(
      std::chrono::microseconds(l->delay_us()), std::chrono::microseconds(l->jitter_us()),
      text(l->delay_text()));
  if (!delay.ok()) return delay.status();
  a.link_delay = std::move(delay).value();
  node::Result<faults::LinkLoss> loss = faults::LinkLoss::fromValues(
      l->loss_probability(), std::chrono::microseconds(l->rto_us()), text(l->loss_text()));
  if (!loss.ok()) return loss.status();
  a.link_loss = std::move(loss).value();
  return node::Status();
}

flatbuffers::Offset<fb::Sparse> encodeSparse(flatbuffers::FlatBufferBuilder& b,
                                             const SparseNodeArgs& s) {
  const SparseFlags& f = s.flags;
  const ml::MfOptions& m = f.mf;
  const auto mf = fb::CreateMfDirect(b, m.rank, m.reg, m.optimizer.c_str(), m.learningRate,
                                     m.batchSize, m.epochs, m.initStd, m.globalMean, m.seed,
                                     m.metricsPath.c_str(), m.logEverySteps, m.targetRatio);
  const ml::ZipfRatingsOptions& z = f.zipf;
  const auto zipf = fb::CreateZipf(b, z.rows, z.cols, z.cells, z.testShare, z.rank, z.rowExponent,
                                   z.colExponent, z.noiseSigma, z.seed, z.memoryLimitBytes);
  const ml::KgeConfig& k = f.kge;
  const auto kge =
      fb::CreateKge(b, static_cast<int>(k.model), k.dim, k.negatives, k.allNegatives,
                    k.sharedNegatives, static_cast<int>(k.loss), k.adversarialTemperature,
                    static_cast<int>(k.regularizer), k.regWeight, k.initScale, k.reciprocal);
  std::vector<flatbuffers::Offset<flatbuffers::String>> given;
  for (const std::string& flag : s.given)
    given.push_back(b.CreateString(flag));
  return fb::CreateSparseDirect(
      b, f.reg.c_str(), f.regWeight, f.optimizer.c_str(), f.initScale, mf, zipf, f.dataFile.c_str(),
      f.writeData.c_str(), kge, f.negatives.c_str(), f.loss.c_str(), f.evalEvery, f.timeLimit,
      f.keepBest, f.adagradInitial, s.logEvery, &given, s.sampleScheme.c_str(), s.sampleReuse,
      s.gossip.cold_every, s.gossip.round_bytes, s.gossip.hot_bytes, s.gossip.relay_hops,
      s.gossip.dense_exchange, s.technique.c_str(), s.replicate, s.replicaBytes,
      s.replicaSyncsPerSecond, s.mfSchedule.c_str());
}

SparseNodeArgs decodeSparse(const fb::Sparse& s) {
  SparseNodeArgs out;
  SparseFlags& f = out.flags;
  f.reg = text(s.reg());
  f.regWeight = s.reg_weight();
  f.optimizer = text(s.optimizer());
  f.initScale = s.init_scale();
  if (const fb::Mf* m = s.mf()) {
    f.mf.rank = m->rank();
    f.mf.reg = m->reg();
    f.mf.optimizer = text(m->optimizer());
    f.mf.learningRate = m->learning_rate();
    f.mf.batchSize = m->batch_size();
    f.mf.epochs = m->epochs();
    f.mf.initStd = m->init_std();
    f.mf.globalMean = m->global_mean();
    f.mf.seed = m->seed();
    f.mf.metricsPath = text(m->metrics_path());
    f.mf.logEverySteps = m->log_every_steps();
    f.mf.targetRatio = m->target_ratio();
  }
  if (const fb::Zipf* z = s.zipf()) {
    f.zipf.rows = z->rows();
    f.zipf.cols = z->cols();
    f.zipf.cells = z->cells();
    f.zipf.testShare = z->test_share();
    f.zipf.rank = z->rank();
    f.zipf.rowExponent = z->row_exponent();
    f.zipf.colExponent = z->col_exponent();
    f.zipf.noiseSigma = z->noise_sigma();
    f.zipf.seed = z->seed();
    f.zipf.memoryLimitBytes = z->memory_limit_bytes();
  }
  f.dataFile = text(s.data_file());
  f.writeData = text(s.write_data());
  if (const fb::Kge* k = s.kge()) {
    f.kge.model = static_cast<ml::KgeModelKind>(k->model());
    f.kge.dim = k->dim();
    f.kge.negatives = k->negatives();
    f.kge.allNegatives = k->all_negatives();
    f.kge.sharedNegatives = k->shared_negatives();
    f.kge.loss = static_cast<ml::KgeLossKind>(k->loss());
    f.kge.adversarialTemperature = k->adversarial_temperature();
    f.kge.regularizer = static_cast<ml::KgeRegularizerKind>(k->regularizer());
    f.kge.regWeight = k->reg_weight();
    f.kge.initScale = k->init_scale();
    f.kge.reciprocal = k->reciprocal();
  }
  f.negatives = text(s.negatives());
  f.loss = text(s.loss());
  f.evalEvery = s.eval_every_epochs();
  f.timeLimit = s.time_limit();
  f.keepBest = s.keep_best();
  f.adagradInitial = s.adagrad_initial();
  out.logEvery = s.log_every();
  out.sampleScheme = text(s.sample_scheme());
  out.sampleReuse = s.sample_reuse();
  out.gossip.cold_every = s.cold_every();
  out.gossip.round_bytes = s.round_bytes();
  out.gossip.hot_bytes = s.hot_bytes();
  out.gossip.relay_hops = s.relay_hops();
  out.gossip.dense_exchange = s.dense_exchange();
  if (s.technique() != nullptr) out.technique = s.technique()->str();
  out.replicate = s.replicate();
  out.replicaBytes = s.replica_bytes();
  out.replicaSyncsPerSecond = s.replica_syncs_per_s();
  if (s.mf_schedule() != nullptr && s.mf_schedule()->size() > 0)
    out.mfSchedule = s.mf_schedule()->str();
  if (s.given() != nullptr) {
    for (const flatbuffers::String* flag : *s.given())
      out.given.insert(flag->str());
  }
  return out;
}

}  // namespace

std::vector<uint8_t> encodeRunSpec(const NodeArgs& a, uint32_t version) {
  flatbuffers::FlatBufferBuilder b(1024);
  const run::RunOptions& r = a.run;
  const auto link = fb::CreateLinkFaultsDirect(
      b, a.link_delay.text.c_str(), a.link_delay.delay.count(), a.link_delay.jitter.count(),
      a.link_loss.text.c_str(), a.link_loss.probability, a.link_loss.rto.count());
  const auto node = fb::CreateNodeDirect(
      b, a.topology.c_str(), a.mode.c_str(), a.log_level.c_str(), a.ready_timeout_s, a.pings,
      a.payload_bytes, a.ping_timeout_s, a.linger_s, a.heartbeat_ms, a.write_slice_packets,
      a.peer_timeout_ms, a.max_frame_mib, a.secret_file.c_str(), link);
  const auto data =
      fb::CreateDataDirect(b, r.data.name.c_str(), r.data.dataDir.c_str(), r.data.syntheticTrain,
                           r.data.syntheticTest, r.data.normalize, r.train_limit);
  const auto model =
      fb::CreateModelDirect(b, r.model.name.c_str(), &r.model.hidden, r.model.dropout);
  const auto shard =
      fb::CreateShard(b, r.shard.kind == run::ShardSpec::Kind::kDirichlet ? 1 : 0, r.shard.alpha);
  const auto stragglers = encodeStragglers(b, r.stragglers);
  const auto training = fb::CreateTrainingDirect(
      b, shard, r.rounds, r.epochs, r.batch, r.lr, r.momentum, r.nesterov, r.weight_decay,
      r.schedule.c_str(), r.warmup_epochs, r.step_epochs, r.gamma, r.augment, r.crop_padding,
      r.flip, r.seed, r.eval_every, r.target_acc, r.out_dir.c_str(), r.save_path.c_str(),
      r.resume_path.c_str(), r.confusion, stragglers, r.checkpoint_every, r.checkpoint_dir.c_str());
  const fb::Staleness staleness(a.staleness.bound);
  const auto backup = fb::CreateBackupRule(b, static_cast<uint8_t>(a.consensus.backup.kind),
                                           a.consensus.backup.value);
  const auto consensus = fb::CreateConsensusDirect(
      b, a.consensus.mixing.c_str(), a.consensus.chunk_floats, a.consensus.skip_gap, backup);
  const auto ps = fb::CreatePsDirect(b, a.ps.key_floats, a.ps.down_timeout_s, a.ps.cache,
                                     a.ps.owner_momentum.c_str(), a.ps.async_rounds.c_str(),
                                     a.ps.async_rounds_given, a.ps.bandwidth_mbps);
  const auto sparse = encodeSparse(b, a.sparse);
  b.Finish(fb::CreateRunSpec(b, version, node, data, model, training, &staleness,
                             a.consensus.rejoin, consensus, ps, sparse),
           fb::RunSpecIdentifier());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

node::Result<NodeArgs> decodeRunSpec(std::span<const uint8_t> bytes, const std::string& source) {
  const auto fail = [&](const std::string& why) {
    return node::invalidInput(
        fmt::format("{}: {}; write it again with `chorus launch` or `chorus "
                    "compare` of this build, or start the node with flags",
                    source, why));
  };
  if (bytes.size() < 8 || !fb::RunSpecBufferHasIdentifier(bytes.data())) {
    return fail("not a chorus run spec (no CRSP identifier)");
  }
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!fb::VerifyRunSpecBuffer(verifier))
    return fail("a damaged run spec (the verifier refused it)");
  const fb::RunSpec* spec = fb::GetRunSpec(bytes.data());
  if (spec->version() != kRunSpecVersion) {
    return fail(fmt::format("a run spec of version {}, and this chorus reads version {}",
                            spec->version(), kRunSpecVersion));
  }
  if (spec->node() == nullptr || spec->data() == nullptr || spec->model() == nullptr ||
      spec->training() == nullptr || spec->staleness() == nullptr || spec->consensus() == nullptr ||
      spec->ps() == nullptr || spec->sparse() == nullptr) {
    return fail("a run spec without all of its sections");
  }
  if (spec->training()->stragglers() == nullptr || spec->consensus()->backup() == nullptr ||
      spec->node()->link() == nullptr) {
    return fail("a run spec without its typed fields");
  }
  NodeArgs a;
  const fb::Node& n = *spec->node();
  a.topology = text(n.topology());
  a.mode = text(n.mode());
  a.log_level = text(n.log_level());
  a.ready_timeout_s = n.ready_timeout_s();
  a.pings = n.pings();
  a.payload_bytes = n.payload_bytes();
  a.ping_timeout_s = n.ping_timeout_s();
  a.linger_s = n.linger_s();
  a.heartbeat_ms = n.heartbeat_ms();
  a.write_slice_packets = n.write_slice_packets();
  a.peer_timeout_ms = n.peer_timeout_ms();
  a.max_frame_mib = n.max_frame_mib();
  a.secret_file = text(n.secret_file());
  if (node::Status link = linkFaultsOf(n.link(), a); !link.ok()) {
    return fail("its link faults are not ones --link-delay and --link-loss give: " +
                link.message());
  }

  run::RunOptions& r = a.run;
  const fb::Data& d = *spec->data();
  r.data.name = text(d.name());
  r.data.dataDir = text(d.dir());
  r.data.syntheticTrain = d.synthetic_train();
  r.data.syntheticTest = d.synthetic_test();
  r.data.normalize = d.normalize();
  r.train_limit = d.limit();
  const fb::Model& m = *spec->model();
  r.model.name = text(m.name());
  r.model.hidden.clear();
  if (m.hidden() != nullptr) r.model.hidden.assign(m.hidden()->begin(), m.hidden()->end());
  r.model.dropout = m.dropout();
  const fb::Training& t = *spec->training();
  node::Result<run::ShardSpec> shard = shardOf(t.shard(), source);
  if (!shard.ok()) return shard.status();
  r.shard = *shard;
  r.rounds = t.rounds();
  r.epochs = t.epochs();
  r.batch = t.batch();
  r.lr = t.lr();
  r.momentum = t.momentum();
  r.nesterov = t.nesterov();
  r.weight_decay = t.weight_decay();
  r.schedule = text(t.schedule());
  r.warmup_epochs = t.warmup_epochs();
  r.step_epochs = t.step_epochs();
  r.gamma = t.gamma();
  r.augment = t.augment();
  r.crop_padding = t.crop_padding();
  r.flip = t.flip();
  r.seed = t.seed();
  node::Result<faults::StragglerProfile> stragglers = stragglersOf(t.stragglers());
  if (!stragglers.ok()) {
    return fail("its straggler profile is not one --stragglers gives: " + stragglers.message());
  }
  r.stragglers = std::move(stragglers).value();
  r.eval_every = t.eval_every();
  r.target_acc = t.target_acc();
  r.out_dir = text(t.out_dir());
  r.save_path = text(t.save_path());
  r.resume_path = text(t.resume_path());
  r.confusion = t.confusion();
  r.checkpoint_every = t.checkpoint_every();
  r.checkpoint_dir = text(t.checkpoint_dir());

  a.staleness = run::StalenessBound{spec->staleness()->bound()};
  a.consensus.rejoin = spec->rejoin();
  const fb::Consensus& c = *spec->consensus();
  node::Result<consensus::BackupRuleSpec> backup = consensus::BackupRuleSpec::fromValues(
      static_cast<consensus::BackupRuleSpec::Kind>(c.backup()->kind()), c.backup()->value());
  if (!backup.ok()) return fail("its backup rule is not one --backup gives: " + backup.message());
  a.consensus.backup = *backup;
  a.consensus.mixing = text(c.mixing());
  a.consensus.chunk_floats = c.chunk_floats();
  a.consensus.skip_gap = c.skip_gap();
  const fb::Ps& p = *spec->ps();
  a.ps.key_floats = p.key_floats();
  a.ps.down_timeout_s = p.down_timeout_s();
  a.ps.cache = p.cache();
  a.ps.owner_momentum = text(p.owner_momentum());
  a.ps.async_rounds = text(p.async_rounds());
  a.ps.async_rounds_given = p.async_rounds_given();
  a.ps.bandwidth_mbps = p.bandwidth_mbps();
  a.sparse = decodeSparse(*spec->sparse());
  return a;
}

node::Status writeRunSpec(const NodeArgs& args, const std::string& path) {
  const std::vector<uint8_t> bytes = encodeRunSpec(args);
  // Written beside and renamed into place: a child never reads half a spec.
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {
      return node::Status(node::ErrorCode::kIo,
                          fmt::format("{}: cannot write the run spec: {}", path,
                                      std::strerror(errno)));  // NOLINT(concurrency-mt-unsafe)
    }
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    return node::Status(node::ErrorCode::kIo,
                        fmt::format("{}: cannot write the run spec: {}", path, ec.message()));
  }
  return node::Status();
}

node::Result<NodeArgs> readRunSpec(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return node::Status(node::ErrorCode::kIo,
                        fmt::format("--spec {}: cannot read it: {}", path,
                                    std::strerror(errno)));  // NOLINT(concurrency-mt-unsafe)
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  return decodeRunSpec(bytes, "--spec " + path);
}

}  // namespace chorus::cli
