#include "ps/ps_peer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <future>
#include <numeric>
#include <stdexcept>

#include "chorus/chorus_generated.h"
#include "faults/straggler.h"
#include "ml/metrics.h"
#include "ml/rng.h"
#include "ml/train.h"
#include "node/finite.h"
#include "node/node.h"
#include "node/repeated_log.h"
#include "ps/cut_rows.h"
#include "run/cli_checks.h"
#include "run/cluster_checkpoint.h"

namespace chorus::ps {

using SteadyClock = std::chrono::steady_clock;

void addPsOptions(CLI::App& cmd, PsOptions& o) {
  cmd.add_option("--key-floats", o.key_floats,
                 "PS mode: floats per key (the model's flat parameter buffer is cut into keys "
                 "of this length, each owned by one node)")
      ->check(CLI::Range(size_t{1}, size_t{64} << 20))
      ->capture_default_str();
  cmd.add_option("--down-timeout", o.down_timeout_s,
                 "PS mode: seconds after which a worker reported down stops blocking the "
                 "others' reads (its later updates are lost); 0 = never (wait, and say whom)")
      ->check(run::nonNegative())
      ->capture_default_str();
  cmd.add_flag_callback(
      "--no-cache", [&o] { o.cache = false; },
      "PS mode: read every key from its owner each clock instead of serving reads that "
      "are fresh enough under SSP from the worker's row cache");
  cmd.add_option("--owner-momentum", o.owner_momentum,
                 "PS mode: how owners apply --momentum to N pushes per clock: clock = the "
                 "velocity decays by --momentum per clock, as on one node (docs/ps.md); push = "
                 "by --momentum per push")
      ->check(CLI::IsMember({"clock", "push"}))
      ->capture_default_str();
  cmd.add_option(kAsyncRoundsFlag, o.async_rounds,
                 "PS mode with --staleness inf: cluster = train until the workers' clocks add "
                 "up to N x --rounds (fast workers run more clocks, slow ones fewer; the learning "
                 "rate follows the cluster's progress); worker = every worker runs --rounds "
                 "clocks. Bounded staleness always runs --rounds clocks per worker")
      ->check(CLI::IsMember({"cluster", "worker"}))
      ->capture_default_str()
      ->each([&o](const std::string&) { o.async_rounds_given = true; });
  cmd.add_option("--bandwidth", o.bandwidth_mbps,
                 "PS mode with a finite --staleness: managed communication (Bösen; "
                 "docs/managed-comm.md). Each node may send MBPS Mbit/s in all, measured on its "
                 "frames; what pulls, pushes and clocks leave of it, owners spend pushing fresh "
                 "values of their most-changed keys to the workers' row caches, so that reads "
                 "need no round trip. Reads the pushes did not refresh in time are pulled as "
                 "before (the SSP bound holds whatever the budget). 0 = off")
      ->type_name("MBPS")
      ->check(run::nonNegative())
      ->capture_default_str();
}

AsyncRounds parseAsyncRounds(std::string_view text) {
  if (text == "cluster") return AsyncRounds::kCluster;
  if (text == "worker") return AsyncRounds::kWorker;
  throw std::invalid_argument(
      fmt::format("--async-rounds must be cluster or worker, not '{}'", text));
}

void validatePsOptions(const PsOptions& o) {
  if (o.staleness.bound < 0) {
    throw std::invalid_argument(
        fmt::format("--staleness: bad staleness '{}': the bound must be >= 0", o.staleness.bound));
  }
  if (o.key_floats == 0) throw std::invalid_argument("--key-floats must be > 0");
  OwnerOptimizer::parseMomentum(o.owner_momentum);
  parseAsyncRounds(o.async_rounds);
  if (!(o.down_timeout_s >= 0)) throw std::invalid_argument("--down-timeout must be >= 0");
  validateBandwidth(o.bandwidth_mbps);
  if (o.bandwidth_mbps > 0 && !o.cache) {
    throw std::invalid_argument(
        "--bandwidth with --no-cache: managed communication pushes rows into the workers' row "
        "cache; drop one of the two");
  }
}

namespace {

double seconds(SteadyClock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

PsPeer::PsPeer(node::Node& node, run::NodeJob job, std::vector<NodeId> members, PsOptions options)
    : node_(node),
      job_(std::move(job)),
      members_(std::move(members)),
      options_(std::move(options)),
      staleness_((validatePsOptions(options_), options_.staleness)),
      map_(members_),
      layout_(job_.model->size(), options_.key_floats),
      membership_(node.id(), members_) {
  std::sort(members_.begin(), members_.end());
  cluster_budget_ =
      staleness_.infinite() && parseAsyncRounds(options_.async_rounds) == AsyncRounds::kCluster;
  if (options_.async_rounds_given && !staleness_.infinite()) {
    node_.logger().warn(
        "--async-rounds {} is ignored with --staleness {}: it applies only to fully asynchronous "
        "runs (--staleness inf); bounded staleness runs --rounds clocks on every worker",
        options_.async_rounds, staleness_.toString());
  }
  optimizer_.sgd = job_.sgd;
  optimizer_.schedule = job_.schedule;
  optimizer_.push_scale = 1.0 / static_cast<double>(members_.size());
  optimizer_.momentum_mode = OwnerOptimizer::parseMomentum(options_.owner_momentum);
  ServerOptions server_options;
  server_options.down_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(options_.down_timeout_s * 1000.0)));
  server_options.report_every = options_.report_every;
  server_options.bsp = !staleness_.infinite() && staleness_.bound == 0;
  server_options.lr_by_progress = cluster_budget_;
  server_options.hold_until_restored = options_.rejoin;
  server_options.max_lead = leadLimit(staleness_);
  // A worker announces clocks up to its last one (rounds), a rejoining one may resume one
  // past it; under a cluster budget one worker may run the whole budget, plus the overshoot.
  const Clock workers = static_cast<Clock>(members_.size());
  server_options.max_clock =
      cluster_budget_ ? job_.rounds * workers + 2 * workers + 1 : job_.rounds + 1;
  server_options.on_running_job = [this](WorkerId worker, Clock clock) {
    const std::string error = fmt::format(
        "node {} started into a running PS job: worker node {} is already at clock {}, and this "
        "node's keys hold the initial model; start this node with --rejoin (or restart every "
        "node)",
        node_.id(), worker, clock);
    node_.logger().error("{}", error);
    {
      auto lock = membership_.lock();
      running_job_error_ = error;
    }
    stop();
  };
  server_options.on_waiting = options_.on_owner_waiting;
  KeyStore store(layout_, map_, node_.id(), job_.model->params(), optimizer_);
  if (job_.cuts.resumed) {
    // Every worker of the cut had finished the clocks below it (docs/checkpoints.md).
    if (cluster_budget_) {
      throw std::invalid_argument(
          "--resume DIR needs bounded staleness or --async-rounds worker in PS mode");
    }
    restoreRows(store);
    server_options.start_clock = job_.cuts.resumed->header.cut;
  }
  server_ = std::make_unique<KvServer>(node_, std::move(store), members_, server_options);
  // Managed communication needs a bound: fully asynchronous workers keep no cache to push to.
  const bool managed = options_.bandwidth_mbps > 0 && !staleness_.infinite();
  if (options_.bandwidth_mbps > 0 && !managed) {
    node_.logger().warn(
        "--bandwidth {} is ignored with --staleness inf: managed communication feeds the row "
        "cache of a bounded run, and asynchronous workers read every key from its owner",
        options_.bandwidth_mbps);
  }
  if (managed && !optimizer_.stateless()) {
    node_.logger().warn(
        "--bandwidth {} with owners' momentum: a worker drops the cached rows of the keys it "
        "pushes (it cannot apply the owners' momentum step to them), and a dense model pushes "
        "every key each clock, so reads still go to the owners; managed communication pays off "
        "with --momentum 0 (docs/managed-comm.md)",
        options_.bandwidth_mbps);
  }
  WorkerOptions worker_options;
  worker_options.staleness = staleness_;
  worker_options.cache = options_.cache;
  worker_options.report_every = options_.report_every;
  worker_options.on_waiting = options_.on_worker_waiting;
  worker_ = std::make_unique<KvWorker>(node_, *server_, map_, layout_, optimizer_, worker_options);
  // Every clock's pull lands in the model's parameters: a rejoining owner gets its keys from
  // there.
  worker_->setModelView(job_.model->params());
  if (managed) {
    ManagedCommOptions managed_options;
    managed_options.bandwidth_mbps = options_.bandwidth_mbps;
    managed_ = std::make_unique<ManagedComm>(node_, *server_, *worker_, members_, managed_options);
  }

  node_.setHandler(messageType(wire::Body::PsCatchupRequest),
                   [this](NodeId from, const node::InboundFrame&) { answerCatchup(from); });
  node_.setHandler(messageType(wire::Body::PsCatchupReply),
                   [this](NodeId from, const node::InboundFrame& frame) {
                     onCatchupReply(from, *messageOf(frame).body_as_PsCatchupReply());
                   });
  barrier_ =
      std::make_unique<PsRunBarrier>(node_, *server_, *worker_, membership_, options_.tick_every);
}

void PsPeer::tickNow() {
  barrier_->tickNow();
}

PsPeer::~PsPeer() = default;

void PsPeer::stop() {
  if (managed_) managed_->stop();
  membership_.stop();
  tickNow();
  worker_->cancelAll({node::ErrorCode::kShutdown, "stopped"});
}

PsReport PsPeer::run() {
  report_ = PsReport{};
  clocks_ = ClockState{};
  clocks_.keys.resize(layout_.numKeys());
  std::iota(clocks_.keys.begin(), clocks_.keys.end(), Key{0});
  clocks_.stats_before = worker_->stats();
  if (managed_) managed_->start();
  // An owner lost for good fails one push per clock for the rest of the run: one line, then
  // counts.
  clocks_.lost_pushes =
      std::make_unique<node::RepeatedLog>(node_.logger(), spdlog::level::warn, "a push was lost");
  run::LoopOptions loop;
  loop.append_metrics = options_.rejoin;  // a rejoining node keeps its earlier life's lines
  loop.confusion = job_.confusion;
  const run::LoopReport done = run::runTrainingLoop(job_, *this, node_.logger(), loop);
  clocks_.lost_pushes.reset();
  PsReport report = std::move(report_);
  static_cast<run::LoopReport&>(report) = done;
  report.clocks_done = done.steps_done;
  report.final_loss = done.final.loss;
  report.final_accuracy = done.final.accuracy;
  return report;
}

void PsPeer::describe(ml::MetricsEvent& start) {
  const size_t owned = server_->store().ownedKeys().size();
  start.add("staleness", staleness_.toString())
      .add("key_floats", static_cast<uint64_t>(layout_.chunk()))
      .add("owner_momentum", options_.owner_momentum)
      .add("async_rounds", staleness_.infinite() ? options_.async_rounds : "")
      .add("bandwidth_mbps", managed_ ? options_.bandwidth_mbps : 0.0)
      .add("keys", static_cast<uint64_t>(layout_.numKeys()))
      .add("owned_keys", static_cast<uint64_t>(owned))
      .addBool("cache", options_.cache && !staleness_.infinite())
      .add("workers", static_cast<uint64_t>(members_.size()));
  const std::string clocks =
      cluster_budget_
          ? fmt::format("{} clocks across the cluster ({} per worker on average)",
                        job_.rounds * static_cast<int64_t>(members_.size()), job_.rounds)
          : fmt::format("{} clocks", job_.rounds);
  node_.logger().info(
      "ps: {} on {} samples, model {} ({} parameters in {} keys of {} floats, {} owned here), "
      "staleness {}, {} workers",
      clocks, job_.shard.size(), job_.model->spec().toString(), job_.model->size(),
      layout_.numKeys(), layout_.chunk(), owned, staleness_.toString(), members_.size());
}

int64_t PsPeer::firstStep(ml::MetricsWriter& metrics) {
  if (job_.cuts.resumed) {
    // Every owner starts with every worker at the cut's clock (ServerOptions::start_clock) and
    // the cut's rows; this worker continues at that clock.
    const Clock cut = job_.cuts.resumed->header.cut;
    worker_->resumeAt(cut);
    report_.first_clock = cut;
    return cut;
  }
  const Clock first_clock = options_.rejoin ? catchUp(report_) : 0;
  report_.first_clock = first_clock;
  if (report_.rejoined_from) {
    metrics.write(ml::MetricsEvent("rejoin")
                      .add("from", static_cast<uint64_t>(*report_.rejoined_from))
                      .add(run::kStepName, first_clock)
                      .add("read_clock", report_.rejoin_read_clock));
  }
  return first_clock;
}

bool PsPeer::finished(int64_t clock) const {
  return cluster_budget_ ? budgetReached(clock) : clock >= job_.rounds;
}

double PsPeer::remoteLr(int64_t clock) const {
  // The clock of the learning-rate schedule: the cluster's progress under a cluster budget.
  const Clock workers = static_cast<Clock>(members_.size());
  return job_.schedule.at(
      cluster_budget_ ? (server_->othersClockTotal(node_.id()) + clock) / workers : clock);
}

run::StepExchange PsPeer::beforeGradient(int64_t c) {
  // 1. Read the model (from the cache when fresh enough, else from the owners); at a cut, once
  // every worker reached it.
  const SteadyClock::time_point start = SteadyClock::now();
  const bool barrier = c == barrier_clock_;
  const node::Status pulled =
      worker_->wait(barrier ? worker_->pullAt(c, clocks_.keys, job_.model->params())
                            : worker_->pull(clocks_.keys, job_.model->params()));
  if (barrier && cut_part_ && !membership_.stopped()) {
    if (pulled.ok()) {
      if (!passCut(c)) return {.stopped = true, .wait_s = seconds(SteadyClock::now() - start)};
    } else {
      node_.logger().warn("cut {}: not written, its barrier read failed ({})", c, pulled.message());
    }
    cut_part_.reset();
  }
  run::StepExchange read{.wait_s = seconds(SteadyClock::now() - start)};
  if (membership_.stopped()) {
    read.stopped = true;
    return read;
  }
  if (!pulled.ok()) {
    ++report_.failed_pulls;
    if (pulled.message() != clocks_.last_pull_error) {
      node_.logger().warn("clock {}: {}; training on with the last values of those keys", c,
                          pulled.message());
      clocks_.last_pull_error = pulled.message();
    }
  }
  return read;
}

std::string PsPeer::divergence(double loss, int64_t c) const {
  // Every value from a peer is checked finite when it arrives; a refused one is named here,
  // since its keys may have kept what came (docs/errors.md).
  return fmt::format(
      "training diverged (loss {}) at clock {}{}", loss, c,
      clocks_.last_pull_error.empty()
          ? std::string(": lower --lr (the parameters read this clock were all finite)")
          : fmt::format(" after a read failed ({}): look at that node before lowering --lr",
                        clocks_.last_pull_error));
}

void PsPeer::settlePush() {
  if (!clocks_.pending_push) return;
  const node::Status status = worker_->wait(*clocks_.pending_push);
  clocks_.pending_push.reset();
  if (!status.ok() && status.code() != node::ErrorCode::kShutdown) {
    ++report_.failed_pushes;
    clocks_.lost_pushes->add(status.message());
  }
}

run::StepExchange PsPeer::exchange(int64_t& clock, double /*compute_s*/) {
  // 3. Push the gradient (at most one push in flight), 4. end the clock.
  settlePush();
  clocks_.pending_push = worker_->push(clocks_.keys, job_.model->grads());
  if (job_.cuts.cutAt(clock + 1, job_.rounds) && !finished(clock + 1)) requestSnapshot(clock + 1);
  worker_->clock();
  return {};
}

void PsPeer::describeStep(ml::MetricsEvent& event) {
  const WorkerStats stats = worker_->stats();
  const WorkerStats& before = clocks_.stats_before;
  const uint64_t hits = stats.cache_hits - before.cache_hits;
  const uint64_t misses = stats.cache_misses - before.cache_misses;
  event
      .add("cache_hit_rate",
           hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0)
      .add("keys_local", stats.keys_local - before.keys_local)
      .add("keys_remote", stats.keys_remote - before.keys_remote);
  clocks_.stats_before = stats;
}

void PsPeer::afterStep(int64_t clock, double /*loss*/, const ml::Evaluation* /*evaluated*/) {
  if (options_.on_clock_end) options_.on_clock_end(clock, job_.model->params());
}

void PsPeer::requestSnapshot(Clock cut) {
  barrier_clock_ = cut;
  // Posted before the clock's announcement (KvWorker::clock() posts it next): the own server
  // cannot see every worker at `cut` before this is registered.
  node_.post([this, cut] {
    server_->whenClocksApplied(cut, [this, cut](const KeyStore& store) {
      CutRows rows = copyCutRows(store, store.ownedKeys());
      OwnerSnapshot taken;
      taken.cut = cut;
      taken.keys = std::move(rows.keys);
      taken.updates = std::move(rows.updates);
      taken.values = std::move(rows.values);
      taken.state = std::move(rows.state);
      {
        auto lock = membership_.lock();
        snapshot_ = std::move(taken);
      }
      membership_.notify();
    });
  });
}

void PsPeer::cutReached(run::NodeCheckpoint& part) {
  cut_part_ = std::move(part);
}

bool PsPeer::passCut(Clock cut) {
  OwnerSnapshot taken;
  {
    auto lock = membership_.lock();
    // Every worker reached the cut (the barrier read was answered): the own server's snapshot
    // is due, or taken already.
    while (snapshot_.cut != cut) {
      if (membership_.stoppedLocked()) return false;
      membership_.waitFor(lock, options_.report_every,
                          [&] { return snapshot_.cut == cut || membership_.stoppedLocked(); });
    }
    taken = std::move(snapshot_);
    snapshot_ = OwnerSnapshot{};
  }
  run::NodeCheckpoint& part = *cut_part_;
  putCutRows({.keys = std::move(taken.keys),
              .updates = std::move(taken.updates),
              .values = std::move(taken.values),
              .state = std::move(taken.state)},
             part);
  part.words["key_floats"] = {static_cast<uint64_t>(layout_.chunk())};
  const std::string path = run::writeNodeCheckpoint(job_.cuts.dir, part, job_.cuts.every);
  node_.logger().info("clock {}: wrote this node's part of cut {} to {}", cut, cut, path);
  return true;
}

void PsPeer::restoreRows(KeyStore& store) const {
  const run::NodeCheckpoint& cut = *job_.cuts.resumed;
  const std::string& path = job_.cuts.resumed_path;
  const std::string remedy =
      "resume with the --key-floats, topology and --owner-momentum the checkpoints were written "
      "with";
  auto it = cut.words.find("key_floats");
  if (it == cut.words.end()) {
    throw run::NodeCheckpointError(
        fmt::format("{}: no 'key_floats' array (not a PS checkpoint); {}", path, remedy));
  }
  const std::vector<uint64_t>& key_floats = it->second;
  if (key_floats.size() != 1 || key_floats[0] != layout_.chunk()) {
    throw run::NodeCheckpointError(fmt::format(
        "{}: written with {} floats per key, this run cuts the model into keys of {}; {}", path,
        key_floats.empty() ? 0 : key_floats[0], layout_.chunk(), remedy));
  }
  restoreCutRows(store, cut, path, remedy);
}

void PsPeer::afterLastStep() {
  settlePush();
  auto lock = membership_.lock();
  if (!running_job_error_.empty()) throw std::runtime_error(running_job_error_);
}

run::Traffic PsPeer::traffic() const {
  const node::PeerStats totals = node_.totals();
  return {totals.bytes_out, totals.bytes_in};
}

void PsPeer::describeEnd(ml::MetricsEvent& last) {
  report_.worker = worker_->stats();
  report_.server = server_->summary();
  const WorkerStats& worker = report_.worker;
  const uint64_t reads = worker.cache_hits + worker.cache_misses;
  last.add("cache_hit_rate",
           reads > 0 ? static_cast<double>(worker.cache_hits) / static_cast<double>(reads) : 0.0)
      .add("keys_local", worker.keys_local)
      .add("keys_remote", worker.keys_remote)
      .add("failed_pulls", report_.failed_pulls)
      .add("failed_pushes", report_.failed_pushes);
  std::vector<std::string> lost;
  for (const auto& [node, at] : report_.server.excluded)
    lost.push_back(fmt::format("{{\"node\":{},\"from_clock\":{}}}", node, at));
  for (const ServerSummary::SkippedClocks& gap : report_.server.skipped) {
    lost.push_back(fmt::format("{{\"node\":{},\"from_clock\":{},\"to_clock\":{}}}", gap.worker,
                               gap.from, gap.to));
  }
  last.addRaw("lost_updates", fmt::format("[{}]", fmt::join(lost, ",")));
  if (report_.owner_accuracy) last.add("owner_accuracy", *report_.owner_accuracy);
  if (managed_) {
    report_.managed = managed_->stats();
    const ManagedCommStats& m = *report_.managed;
    last.add("managed_frames", m.frames_sent)
        .add("managed_rows_sent", m.rows_sent)
        .add("managed_bytes", m.managed_bytes)
        .add("managed_rows_received", m.rows_received)
        .add("managed_refused", m.refused);
  }
}

std::vector<NodeId> freshestFirst(std::vector<std::pair<NodeId, Clock>> reads) {
  std::sort(reads.begin(), reads.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  std::vector<NodeId> order;
  order.reserve(reads.size());
  for (const auto& [node, clock] : reads)
    order.push_back(node);
  return order;
}

Clock lastClockHeard(NodeId self, const std::vector<std::vector<WorkerView>>& views) {
  Clock own = 0;
  for (const auto& answer : views) {
    for (const WorkerView& view : answer) {
      if (view.worker == self) own = std::max(own, view.clock);
    }
  }
  return own;
}

Clock PsPeer::catchUp(PsReport& report) {
  spdlog::logger& log = node_.logger();
  const NodeId self = node_.id();
  // Every live node is asked at once: their last reads of this node's keys differ in age (a
  // straggler's can be many clocks older), and only their answers tell which is freshest.
  std::vector<NodeId> asked;
  {
    auto lock = membership_.lock();
    for (NodeId helper : membership_.others()) {
      if (!membership_.isDownLocked(helper)) asked.push_back(helper);
    }
    catchup_asked_ = std::set<NodeId>(asked.begin(), asked.end());
    catchup_answers_.clear();
  }
  if (!asked.empty()) {
    log.info("rejoining: asking node(s) {} for this node's keys and the workers' clocks",
             fmt::join(asked, ", "));
    node_.broadcast(asked, encodeMessage(node_, wire::Body::PsCatchupRequest,
                                         [](flatbuffers::FlatBufferBuilder& b) {
                                           return wire::CreatePsCatchupRequest(b).Union();
                                         }));
  }
  std::map<NodeId, Catchup> answers;
  std::set<NodeId> gone;
  bool answered_all = true;
  {
    auto lock = membership_.lock();
    answered_all = membership_.waitFor(lock, options_.rejoin_timeout, [&] {
      for (NodeId helper : asked) {
        if (catchup_answers_.count(helper) == 0 && !membership_.isDownLocked(helper)) return false;
      }
      return true;
    });
    answers = std::move(catchup_answers_);
    catchup_answers_.clear();
    catchup_asked_.clear();
    for (NodeId helper : asked) {
      if (membership_.isDownLocked(helper)) gone.insert(helper);
    }
  }
  std::vector<std::pair<NodeId, Clock>> reads;
  for (NodeId helper : asked) {
    auto it = answers.find(helper);
    if (it == answers.end()) {
      log.warn("rejoining: node {} {}", helper,
               gone.count(helper) > 0 ? std::string("went down")
               : !answered_all        ? fmt::format("did not answer within {} s",
                                                    options_.rejoin_timeout.count() / 1000.0)
                                      : std::string("did not answer (stopped)"));
    } else if (!it->second.error.empty()) {
      log.warn("rejoining: node {} could not help: {}", helper, it->second.error);
    } else {
      reads.emplace_back(helper, it->second.read_clock);
    }
  }
  report.rejoin_answers = reads;
  // The clock this worker was in when it died: the latest any helper heard of. The freshest
  // answer's owner need not have heard the last announcement (it may have queued behind pushes),
  // and an owner that did would refuse the clocks below it as going backwards.
  std::vector<std::vector<WorkerView>> views;
  views.reserve(reads.size());
  for (const auto& read : reads)
    views.push_back(answers.at(read.first).views);
  const Clock own = lastClockHeard(self, views);
  for (NodeId helper : freshestFirst(reads)) {
    Catchup& reply = answers.at(helper);
    // The store belongs to the loop thread. The task owns the promise: should the loop drop
    // it unrun (shutdown), get() throws instead of waiting forever.
    auto restored = std::make_shared<std::promise<std::optional<std::string>>>();
    auto result = restored->get_future();
    const bool posted = node_.post([this, restored, &reply] {
      restored->set_value(server_->restore(reply.keys, reply.values, reply.views));
    });
    if (!posted) {
      throw std::runtime_error(fmt::format(
          "node {}: shut down during its PS rejoin, before its keys were restored", self));
    }
    if (const std::optional<std::string> error = result.get()) {
      log.warn(
          "rejoining: node {}'s answer does not fit this node's keys: {}; trying the next "
          "answer",
          helper, *error);
      continue;
    }
    // The clock after the one this worker was in when it died (that clock's updates are lost,
    // and an owner that heard of a later clock than the helper would refuse a lower one).
    // Asynchronous: nobody waits for it. Bounded: start no lower than the slowest worker that
    // still counts, so that the others do not wait while this node redoes clocks whose updates
    // are lost anyway.
    Clock slowest = Staleness::kInfinite;
    for (const WorkerView& view : reply.views) {
      if (view.worker != self && view.counted) slowest = std::min(slowest, view.clock);
    }
    const Clock resume = staleness_.infinite() || slowest == Staleness::kInfinite
                             ? own + 1
                             : std::max(own + 1, slowest);
    worker_->resumeAt(resume);
    if (reply.read_clock < 0) {
      log.warn(
          "rejoining: no live node has read this node's keys yet, so they start again from the "
          "initial model (every update they had received is lost)");
    }
    report.rejoined_from = helper;
    report.rejoin_read_clock = reply.read_clock;
    log.info(
        "rejoined: {} key(s) restored from node {}'s last read, the freshest of {} answer(s) "
        "(every update from clocks below {} in them; their momentum starts again from zero); "
        "this worker was at clock {}, joining at clock {}",
        reply.keys.size(), helper, reads.size(), reply.read_clock, own, resume);
    return resume;
  }
  throw std::runtime_error(fmt::format(
      "node {}: no live node gave this node's keys back for the PS rejoin (asked: {}); start "
      "every node without --rejoin when the whole cluster restarts",
      self,
      asked.empty() ? std::string("none was up") : fmt::format("{}", fmt::join(asked, ", "))));
}

void PsPeer::answerCatchup(NodeId to) {
  std::vector<Key> keys;
  for (Key key = 0; key < layout_.numKeys(); ++key) {
    if (map_.home(key) == to) keys.push_back(key);
  }
  std::vector<float> values;
  Clock read_clock = -1;
  std::optional<std::string> error = worker_->lastRead(keys, values, read_clock);
  const std::vector<WorkerView> views = server_->workerViews();
  node_.logger().info("node {} is rejoining: sending it {} key(s) as last read here{}", to,
                      keys.size(), error ? fmt::format(" (cannot: {})", *error) : "");
  node_.send(to, encodeMessage(
                     node_, wire::Body::PsCatchupReply,
                     [&](flatbuffers::FlatBufferBuilder& b) {
                       if (error) {
                         return wire::CreatePsCatchupReply(b, b.CreateString(*error)).Union();
                       }
                       std::vector<uint32_t> workers;
                       std::vector<int64_t> clocks;
                       std::vector<uint8_t> counted;
                       for (const WorkerView& view : views) {
                         workers.push_back(view.worker);
                         clocks.push_back(view.clock);
                         counted.push_back(view.counted ? 1 : 0);
                       }
                       auto w = b.CreateVector(workers);
                       auto c = b.CreateVector(clocks);
                       auto n = b.CreateVector(counted);
                       auto k = b.CreateVector(keys);
                       auto v = b.CreateVector(values);
                       return wire::CreatePsCatchupReply(b, 0, w, c, n, k, v, read_clock).Union();
                     },
                     values.size() * sizeof(float) + keys.size() * sizeof(uint64_t) + 1024));
}

void PsPeer::onCatchupReply(NodeId from, const wire::PsCatchupReply& reply) {
  Catchup catchup;
  if (reply.error() != nullptr && reply.error()->size() > 0) {
    catchup.error = reply.error()->str();
  } else if (reply.workers() == nullptr || reply.clocks() == nullptr ||
             reply.counted() == nullptr || reply.keys() == nullptr || reply.values() == nullptr ||
             reply.clocks()->size() != reply.workers()->size() ||
             reply.counted()->size() != reply.workers()->size()) {
    catchup.error = "malformed PsCatchupReply (fields missing or of different lengths)";
  } else if (const size_t bad = node::countNonFinite(
                 std::span<const float>(reply.values()->data(), reply.values()->size()));
             bad > 0) {
    catchup.error = fmt::format("PsCatchupReply with {} non-finite value(s)", bad);
  } else {
    catchup.keys.assign(reply.keys()->begin(), reply.keys()->end());
    catchup.values.assign(reply.values()->begin(), reply.values()->end());
    catchup.read_clock = reply.read_clock();
    for (size_t i = 0; i < reply.workers()->size(); ++i) {
      catchup.views.push_back(
          {reply.workers()->Get(i), reply.clocks()->Get(i), reply.counted()->Get(i) != 0});
    }
    // Checked before catchUp() takes this node's own clock from them (lastClockHeard).
    if (auto error = server_->checkViews(catchup.views)) {
      catchup = Catchup{};
      catchup.error = fmt::format("PsCatchupReply with {}", *error);
    }
  }
  {
    auto lock = membership_.lock();
    if (catchup_asked_.count(from) == 0 || catchup_answers_.count(from) > 0) {
      node_.logger().warn(
          "dropped a PsCatchupReply from node {}, which was not asked (or answered after the "
          "rejoin's time-out, or twice)",
          from);
      return;
    }
    catchup_answers_[from] = std::move(catchup);
  }
  membership_.notify();
}

bool PsPeer::budgetReached(Clock own_clocks) const {
  return server_->othersClockTotal(node_.id()) + own_clocks >=
         job_.rounds * static_cast<Clock>(members_.size());
}

void PsPeer::finish(int64_t clocks_done, std::vector<uint32_t>& finished,
                    std::vector<uint32_t>& departed) {
  constexpr NodeId kReporter = 0;
  if (node_.id() == kReporter) {
    if (cluster_budget_) {
      // Workers end at different clocks, so no clock marks "every update is in". A worker says
      // TrainingDone only after its last push was acknowledged, and asynchronous owners apply a
      // push before acknowledging it: once every other worker is done (or gone), all are in.
      settle(finished, departed);
      readOwnersModel(0);
    } else {
      // Every worker's last update (or its exclusion) is in before this read is answered.
      readOwnersModel(job_.rounds);
    }
  }
  run::PeerSettlement settled = barrier_->finish(clocks_done, settleOptions());
  finished = std::move(settled.finished);
  departed = std::move(settled.departed);
  if (!departed.empty()) {
    node_.logger().warn(
        "node(s) {} left before the end of training; the keys they owned stayed at their "
        "last values on the other workers",
        fmt::join(departed, ", "));
  }
}

void PsPeer::readOwnersModel(Clock min_clock) {
  spdlog::logger& log = node_.logger();
  ml::Model& model = *job_.model;
  std::unique_ptr<ml::Model> owners = model.clone();
  std::vector<Key> keys(layout_.numKeys());
  std::iota(keys.begin(), keys.end(), Key{0});
  if (cluster_budget_) {
    log.info("reading the owners' model after every worker's last clock");
  } else {
    log.info("reading the owners' model after clock {} of every worker", min_clock);
  }
  const node::Status status = worker_->wait(worker_->pullAt(min_clock, keys, owners->params()));
  // The keys of an owner that went down are gone; they keep the values this worker read last
  // (the clone starts from them), and the log says so.
  const bool owners_lost =
      status.code() == node::ErrorCode::kClosed || status.code() == node::ErrorCode::kNotConnected;
  if (!status.ok() && !owners_lost) {
    log.warn("could not read the owners' model: {}", status.message());
    return;
  }
  if (owners_lost) {
    log.warn(
        "the owners' model lacks the keys of departed owners ({}); they keep the values this "
        "worker read last",
        status.message());
  }
  const ml::Evaluation eval = ml::evaluate(*owners, job_.data->test);
  report_.owner_accuracy = eval.accuracy;
  report_.owner_model.assign(owners->params().begin(), owners->params().end());
  log.debug("test accuracy of the model as held by the owners: {:.2f}%", 100 * eval.accuracy);
}

run::SettleOptions PsPeer::settleOptions() const {
  run::SettleOptions options;
  options.timeout = options_.finish_timeout;
  options.report_every = options_.report_every;
  return options;
}

void PsPeer::settle(std::vector<uint32_t>& finished, std::vector<uint32_t>& departed) {
  run::PeerSettlement settled = membership_.settle(settleOptions(), node_.logger());
  finished = std::move(settled.finished);
  departed = std::move(settled.departed);
}

}  // namespace chorus::ps
