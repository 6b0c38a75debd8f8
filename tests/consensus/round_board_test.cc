// The round board with real threads: the test thread plays the loop thread (depositing
// models, reporting neighbors down and up), gathers run on a trainer thread.
#include "consensus/round_board.h"

#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;

// The rule `text` names (the tests' names are good ones: read() must accept them).
std::unique_ptr<BackupRule> ruleNamed(std::string_view text) {
  return makeBackupRule(BackupRuleSpec::read(text).value());
}

ModelPtr model(float v) {
  return std::make_shared<const std::vector<float>>(4, v);
}
SteadyTime now() {
  return std::chrono::steady_clock::now();
}

WaitPlan waitFor(size_t m) {
  WaitPlan p;
  p.wait_for = m;
  return p;
}

// A future that must not complete: with a correct board it never does, so a short bounded
// wait cannot produce a false failure.
template <typename T>
bool stillBlocked(std::future<T>& f) {
  return f.wait_for(100ms) == std::future_status::timeout;
}

TEST(RoundBoard, SynchronousRoundWaitsForEveryNeighbor) {
  RoundBoard board({.neighbors = {1, 2}, .staleness_bound = 0});
  auto round0 = std::async(std::launch::async, [&] { return board.gather(0, waitFor(2)); });
  board.modelArrived(1, 0, model(1), now());
  EXPECT_TRUE(stillBlocked(round0));
  board.modelArrived(2, 0, model(2), now());
  GatherResult r = round0.get();
  ASSERT_EQ(r.models.size(), 2u);
  EXPECT_EQ(r.models[0].from, 1u);
  EXPECT_EQ(r.models[1].from, 2u);
  EXPECT_EQ(r.models[0].staleness, 0);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_FALSE(r.timed_out);
}

TEST(RoundBoard, EachModelIsUsedOnce) {
  RoundBoard board({.neighbors = {1}, .staleness_bound = 3});
  board.modelArrived(1, 0, model(1), now());
  EXPECT_EQ(board.gather(0, waitFor(1)).models.size(), 1u);
  // Round 1 with a backup: the round-0 model was already mixed in and is not used again.
  EXPECT_EQ(board.gather(1, waitFor(0)).models.size(), 0u);
  board.modelArrived(1, 1, model(2), now());
  auto r = board.gather(2, waitFor(0));
  ASSERT_EQ(r.models.size(), 1u);
  EXPECT_EQ(r.models[0].round, 1);
  EXPECT_EQ(r.models[0].staleness, 1);
}

TEST(RoundBoard, BackupWorkerLetsRoundsGoOnWithoutASilentNeighbor) {
  // Neighbor 2 is connected but never sends; with one backup the node keeps making rounds
  // (the silent one is stalled after stall_timeout, so the staleness gate lets go of it).
  RoundBoard board(
      {.neighbors = {1, 2}, .staleness_bound = 1, .stall_timeout = 50ms, .round_timeout = 60s});
  for (Round k = 0; k < 20; ++k) {
    board.modelArrived(1, k, model(static_cast<float>(k)), now());
    GatherResult r = board.gather(k, waitFor(1));
    EXPECT_FALSE(r.timed_out);
    ASSERT_EQ(r.models.size(), 1u);
    EXPECT_EQ(r.models[0].from, 1u);
    EXPECT_EQ(r.missing, std::vector<NodeId>{2});
  }
}

TEST(RoundBoard, WaitAllBlocksAndSaysWhomItWaitsFor) {
  RoundBoard board({.neighbors = {1, 2},
                    .staleness_bound = 0,
                    .stall_timeout = 10ms,
                    .round_timeout = 60s,
                    .report_every = 20ms});
  board.modelArrived(1, 0, model(1), now());
  std::promise<std::vector<NodeId>> reported;
  auto f = std::async(std::launch::async, [&] {
    bool once = false;
    return board.gather(0, waitFor(2), [&](const std::vector<NodeId>& missing) {
      if (!once) reported.set_value(missing);
      once = true;
    });
  });
  EXPECT_EQ(reported.get_future().get(), std::vector<NodeId>{2});
  EXPECT_TRUE(stillBlocked(f));
  board.stop();
  EXPECT_TRUE(f.get().stopped);
}

TEST(RoundBoard, RoundTimeoutReturnsWithWhatArrived) {
  RoundBoard board({.neighbors = {1, 2}, .staleness_bound = 0, .round_timeout = 50ms});
  board.modelArrived(1, 0, model(1), now());
  GatherResult r = board.gather(0, waitFor(2));
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.models.size(), 1u);
  EXPECT_EQ(r.missing, std::vector<NodeId>{2});
}

// Without a listener for the waiting reports the board still sleeps between them: it once left
// the report time in the past and spun until the round's time-out.
TEST(RoundBoard, AWaitWithoutAReportListenerSleeps) {
  RoundBoard board(
      {.neighbors = {1}, .staleness_bound = 0, .round_timeout = 400ms, .report_every = 10ms});
  timespec before{}, after{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before);
  EXPECT_TRUE(board.gather(0, waitFor(1)).timed_out);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after);
  const double cpu_s = static_cast<double>(after.tv_sec - before.tv_sec) +
                       static_cast<double>(after.tv_nsec - before.tv_nsec) * 1e-9;
  // Spinning costs the thread the whole 0.4 s (less only if the machine starves it); 40
  // wake-ups cost well under a millisecond each.
  EXPECT_LT(cpu_s, 0.1);
}

TEST(RoundBoard, DownNeighborLeavesTheWaitSetAtOnce) {
  RoundBoard board({.neighbors = {1, 2}, .staleness_bound = 0});
  board.modelArrived(1, 0, model(1), now());
  auto f = std::async(std::launch::async, [&] { return board.gather(0, waitFor(2)); });
  EXPECT_TRUE(stillBlocked(f));
  board.neighborDown(2);
  GatherResult r = f.get();
  EXPECT_EQ(r.live_neighbors, 1u);
  EXPECT_EQ(r.models.size(), 1u);
  EXPECT_EQ(board.liveNeighbors(), std::vector<NodeId>{1});
  // Back up: not waited for until its first model arrives, then part of the rounds again.
  board.neighborUp(2);
  board.modelArrived(1, 1, model(1), now());
  EXPECT_EQ(board.gather(1, waitFor(2)).models.size(), 1u);
  board.modelArrived(2, 2, model(2), now());
  board.modelArrived(1, 2, model(1), now());
  EXPECT_EQ(board.gather(2, waitFor(2)).models.size(), 2u);
}

TEST(RoundBoard, DeadlinePlanWaitsUntilTheDeadlineThenGoesWithOne) {
  RoundBoard board({.neighbors = {1, 2}, .staleness_bound = 5});
  WaitPlan plan = waitFor(1);
  plan.deadline_seconds = 0.05;
  board.modelArrived(1, 0, model(1), now());
  GatherResult r = board.gather(0, plan);
  EXPECT_GE(r.waited_seconds, 0.05);
  EXPECT_EQ(r.models.size(), 1u);
}

TEST(RoundBoard, LateModelsYieldLagsForTheRules) {
  RoundBoard board({.neighbors = {1, 2}, .staleness_bound = 3});
  board.modelArrived(1, 0, model(1), now());  // before the wait: lag 0
  auto r = board.gather(0, waitFor(1));
  // Neighbor 2's round-0 model arrives 0.5 s (in its own clock) after the wait began.
  board.modelArrived(2, 0, model(2), now() + 500ms);
  RoundObservation obs = board.observe(0.01, 1, 1);
  ASSERT_EQ(obs.neighbor_lags.size(), 2u);
  EXPECT_EQ(obs.neighbor_lags[0]->recent(0), 0.0);
  EXPECT_GE(obs.neighbor_lags[1]->recent(0), 0.5);
}

// The staleness bound as a property: neighbors advance at random speeds on their own threads;
// whenever this node completes round k, every live neighbor has sent a model of round >= k - tau,
// and every model used is within tau rounds.
TEST(RoundBoard, StalenessBoundHoldsUnderRandomDelays) {
  for (int64_t tau : {0, 1, 3}) {
    RoundBoard board({.neighbors = {1, 2, 3}, .staleness_bound = tau, .stall_timeout = 60s});
    std::atomic<Round> sent[4] = {-1, -1, -1, -1};
    std::atomic<Round> mine{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> peers;
    for (NodeId j = 1; j <= 3; ++j) {
      peers.emplace_back([&, j] {
        std::mt19937 rng(j * 7 + tau);
        for (Round k = 0; !done; ++k) {
          // A peer runs ahead at most tau rounds of us, like we do of it (it obeys the gate).
          while (!done && k > mine + tau)
            std::this_thread::yield();
          if (done) break;
          // Simulated compute: peer 3 is a straggler, the others are fast with hiccups.
          if (j == 3 || rng() % 4 == 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % (j == 3 ? 1000 : 300)));
          }
          sent[j] = k;
          board.modelArrived(j, k, model(static_cast<float>(k)), now());
        }
      });
    }
    auto rule = ruleNamed("static:2");
    bool ok = true;
    for (Round k = 0; k < 150 && ok; ++k) {
      GatherResult r = board.gather(k, rule->plan(board.observe(0.001, 1, 1)));
      EXPECT_FALSE(r.timed_out);
      for (NodeId j = 1; j <= 3; ++j) {
        if (sent[j].load() < k - tau) {
          ADD_FAILURE() << "tau " << tau << ": round " << k << " ended while node " << j
                        << " had sent only round " << sent[j].load();
          ok = false;
        }
      }
      for (const auto& m : r.models) {
        if (m.staleness > tau) {
          ADD_FAILURE() << "tau " << tau << ": used a model " << m.staleness << " rounds old";
          ok = false;
        }
      }
      mine = k + 1;
    }
    // Always reached, also after a failure: the peers must be stopped and joined.
    done = true;
    board.stop();
    for (auto& t : peers) {
      t.join();
    }
  }
}

// Iteration skipping: the target is the lowest round of the live, joined, working neighbors,
// offered only when every one of them is skip_gap rounds ahead.
TEST(RoundBoard, SkipTargetNeedsEveryWorkingNeighborAhead) {
  RoundBoard board(
      {.neighbors = {1, 2, 3}, .staleness_bound = 2, .stall_timeout = 1s, .skip_gap = 2});
  EXPECT_FALSE(board.skipTarget(0).has_value());  // nobody has sent anything
  board.modelArrived(1, 4, model(1), now());
  board.modelArrived(2, 3, model(2), now());
  // Node 3 sent long ago: stalled, it holds neither the gate nor a skip.
  board.modelArrived(3, 0, model(3), now() - 1h);
  ASSERT_TRUE(board.skipTarget(1).has_value());
  EXPECT_EQ(*board.skipTarget(1), 3);
  EXPECT_FALSE(board.skipTarget(2).has_value());  // node 2 is only one round ahead of 2
  board.neighborDown(2);
  ASSERT_TRUE(board.skipTarget(2).has_value());
  EXPECT_EQ(*board.skipTarget(2), 4);
  // The jump takes the newest models within tau of the target, each once.
  std::vector<UsedModel> taken = board.takeNewest(4);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].from, 1u);
  EXPECT_EQ(taken[0].round, 4);
  EXPECT_EQ(taken[0].staleness, 0);
  EXPECT_TRUE(board.takeNewest(4).empty());

  RoundBoard never({.neighbors = {1}, .staleness_bound = 2, .skip_gap = 0});
  never.modelArrived(1, 9, model(1), now());
  EXPECT_FALSE(never.skipTarget(0).has_value());
}

// A neighbor that skipped rounds counts as arrived for every round its jump covers, with the
// lag of that jump; the gate lag is how long the staleness gate held the round.
TEST(RoundBoard, LagsCoverTheRoundsANeighborSkipped) {
  RoundBoard board({.neighbors = {1}, .staleness_bound = 1});
  board.modelArrived(1, 0, model(0), now());
  ASSERT_FALSE(board.gather(0, waitFor(1)).timed_out);  // lag 0, gate lag 0
  ASSERT_FALSE(board.gather(1, waitFor(0)).timed_out);  // gate: round 0 >= 1 - 1; lag pending
  // Round 2 needs the neighbor at round >= 1: the gate holds it until the jump arrives.
  auto blocked = std::async(std::launch::async, [&] { return board.gather(2, waitFor(0)); });
  ASSERT_TRUE(stillBlocked(blocked));
  board.modelArrived(1, 3, model(3), now() + 500ms);  // it jumped from round 0 to round 3
  GatherResult r = blocked.get();
  ASSERT_EQ(r.models.size(), 0u);  // its round-3 model waits for this node's round 3
  RoundObservation obs = board.observe(0.01, 1, 1);
  ASSERT_EQ(obs.neighbor_lags.size(), 1u);
  ASSERT_EQ(obs.neighbor_gate_lags.size(), 1u);
  const LagWindow& lags = *obs.neighbor_lags[0];
  const LagWindow& gate = *obs.neighbor_gate_lags[0];
  ASSERT_EQ(lags.size(), 3u);  // rounds 0, 1 and 2
  EXPECT_EQ(lags.recent(2), 0.0);
  EXPECT_GE(lags.recent(1), 0.5);
  EXPECT_GE(lags.recent(0), 0.5);
  ASSERT_EQ(gate.size(), 3u);
  EXPECT_EQ(gate.recent(2), 0.0);
  EXPECT_EQ(gate.recent(1), 0.0);
  EXPECT_GE(gate.recent(0), 0.5);
  // The next round finds the jump already there: lag 0 for round 3.
  ASSERT_FALSE(board.gather(3, waitFor(1)).timed_out);
  obs = board.observe(0.01, 1, 1);
  EXPECT_EQ(obs.neighbor_lags[0]->size(), 4u);
  EXPECT_EQ(obs.neighbor_lags[0]->recent(0), 0.0);
}

// The staleness bound with skipping, as a property: this node is the slow one; its neighbors
// (on their own threads) run as far ahead as the gate lets them. Whenever they all wait for
// it, it jumps. Every jump lands on a round every neighbor has reached, every model it mixes
// is within tau, and every round it finishes has every neighbor within tau.
TEST(RoundBoard, StalenessBoundHoldsWhenThisNodeSkips) {
  for (int64_t tau : {1, 2, 3}) {
    RoundBoard board(
        {.neighbors = {1, 2, 3}, .staleness_bound = tau, .stall_timeout = 60s, .skip_gap = tau});
    std::atomic<Round> sent[4] = {-1, -1, -1, -1};
    std::atomic<Round> mine{-1};  // this node's latest round sent
    std::atomic<bool> done{false};
    std::vector<std::thread> peers;
    for (NodeId j = 1; j <= 3; ++j) {
      peers.emplace_back([&, j] {
        std::mt19937 rng(j * 13 + tau);
        for (Round k = 0; !done; ++k) {
          // A peer sends round k once it finished round k - 1, which its gate allows while
          // this node has sent round >= k - 1 - tau.
          while (!done && mine < k - 1 - tau)
            std::this_thread::yield();
          if (done) break;
          if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
          sent[j] = k;
          board.modelArrived(j, k, model(static_cast<float>(k)), now());
        }
      });
    }
    std::mt19937 rng(static_cast<unsigned>(tau));
    auto rule = ruleNamed("static:2");
    int skips = 0;
    bool ok = true;
    for (Round k = 0; k < 150 && ok;) {
      // Half of the rounds this node is slow for sure: it waits until every neighbor is at the
      // bound (held by it); otherwise it races them.
      if (rng() % 2 == 0) {
        for (NodeId j = 1; j <= 3; ++j) {
          while (board.latestRound(j).value_or(-1) < k + tau)
            std::this_thread::yield();
        }
      }
      std::vector<UsedModel> used;
      if (std::optional<Round> target = board.skipTarget(k)) {
        ++skips;
        for (NodeId j = 1; j <= 3; ++j) {
          if (*target < k + tau || *target > sent[j].load()) {
            ADD_FAILURE() << "tau " << tau << ": round " << k << " jumped to " << *target
                          << " while node " << j << " was at " << sent[j].load();
            ok = false;
          }
        }
        k = *target;
        used = board.takeNewest(k);
      }
      mine = k;
      GatherResult r = board.gather(k, rule->plan(board.observe(0.001, 1, 1)));
      EXPECT_FALSE(r.timed_out);
      for (NodeId j = 1; j <= 3; ++j) {
        if (sent[j].load() < k - tau) {
          ADD_FAILURE() << "tau " << tau << ": round " << k << " ended while node " << j
                        << " had sent only round " << sent[j].load();
          ok = false;
        }
      }
      used.insert(used.end(), r.models.begin(), r.models.end());
      for (const auto& m : used) {
        if (m.staleness > tau || m.round > k) {
          ADD_FAILURE() << "tau " << tau << ": round " << k << " used node " << m.from
                        << "'s model of round " << m.round;
          ok = false;
        }
      }
      ++k;
    }
    EXPECT_GT(skips, 10) << "tau " << tau;
    done = true;
    board.stop();
    for (auto& t : peers)
      t.join();
  }
}

}  // namespace
}  // namespace chorus::consensus

namespace chorus::consensus {
namespace {

// A neighbor already a round ahead: its newer model waits for the next round, so round k mixes
// the round-k model (what keeps wait-all with tau = 0 exactly synchronous D-PSGD).
TEST(RoundBoard, AModelFromALaterRoundWaitsForThatRound) {
  RoundBoard board({.neighbors = {1}, .staleness_bound = 0});
  board.modelArrived(1, 0, std::make_shared<const std::vector<float>>(4, 10.0f),
                     std::chrono::steady_clock::now());
  board.modelArrived(1, 1, std::make_shared<const std::vector<float>>(4, 11.0f),
                     std::chrono::steady_clock::now());
  WaitPlan all;
  all.wait_for = 1;
  GatherResult r0 = board.gather(0, all);
  ASSERT_EQ(r0.models.size(), 1u);
  EXPECT_EQ(r0.models[0].round, 0);
  EXPECT_EQ((*r0.models[0].values)[0], 10.0f);
  GatherResult r1 = board.gather(1, all);
  ASSERT_EQ(r1.models.size(), 1u);
  EXPECT_EQ(r1.models[0].round, 1);
  EXPECT_EQ((*r1.models[0].values)[0], 11.0f);
}

// Complete models of a thousand future rounds: a neighbor's newest 2 tau + 2 are kept, and a
// model of a round that can no longer be mixed is not kept at all.
TEST(RoundBoard, ANeighborsModelsAreBoundedByTheWindow) {
  RoundBoard board({.neighbors = {1}, .staleness_bound = 2});
  EXPECT_EQ(board.modelsHeldPerNeighbor(), 6u);
  for (Round round = 0; round < 1000; ++round)
    board.modelArrived(1, round, model(1.0f), now());
  EXPECT_EQ(board.heldModels(), 6u);
  EXPECT_EQ(board.heldBytes(), 6 * 4 * sizeof(float));
  GatherResult r = board.gather(999, waitFor(1));
  ASSERT_EQ(r.models.size(), 1u);
  EXPECT_EQ(r.models[0].round, 999);
  EXPECT_EQ(board.heldModels(), 0u);
  board.modelArrived(1, 996, model(2.0f), now());  // 999 - tau = 997 is the oldest mixable
  EXPECT_EQ(board.heldModels(), 0u);
  board.neighborDown(1);
  EXPECT_EQ(board.heldBytes(), 0u);
}

}  // namespace
}  // namespace chorus::consensus
