// The Dialer's retry policy without sockets: attempts come from a callback, and the backoffs are
// so long that no retry timer fires during the test, so what is armed is read back exactly.
#include "node/dialer.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <array>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "node/event_loop.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using std::chrono::milliseconds;

class DialerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = testing::fastOptions("dial", 0, {0, 5, 7});
    options_.dial_backoff_initial = milliseconds(100'000);
    options_.dial_backoff_max = milliseconds(800'000);
    log_ = spdlog::default_logger();
    loop_ = std::make_unique<EventLoop>(log_);
    loop_->start();
    onLoop([this] {
      dialer_ = std::make_unique<Dialer>(
          loop_->uvLoop(), options_, *log_,
          [this](NodeId peer, const sockaddr_storage&, const std::string& text) {
            attempts_.push_back(peer);
            EXPECT_EQ(text, "host:1");
            // Never dereferenced by the Dialer: an attempt is only compared.
            return reinterpret_cast<Connection*>(&fake_[attempts_.size() % fake_.size()]);
          });
    });
  }
  void TearDown() override {
    onLoop([this] {
      dialer_->stopFromLoop();
      dialer_.reset();
      loop_->stopFromLoop();
    });
    EXPECT_EQ(loop_->join(), 0);
  }
  // Runs `fn` on the loop thread and waits for it.
  void onLoop(std::function<void()> fn) {
    std::promise<void> ran;
    ASSERT_TRUE(loop_->post([&] {
      fn();
      ran.set_value();
    }));
    ran.get_future().wait();
  }
  const Connection* lastAttempt() const {
    return reinterpret_cast<const Connection*>(&fake_[attempts_.size() % fake_.size()]);
  }

  NodeOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Dialer> dialer_;  // loop thread only
  std::vector<NodeId> attempts_;    // loop thread only
  std::array<int, 4> fake_{};
};

TEST_F(DialerTest, FailedAttemptsBackOffDoublingUpToTheMaximum) {
  onLoop([this] {
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    EXPECT_EQ(attempts_, std::vector<NodeId>{5});
    EXPECT_TRUE(dialer_->dials(5));
    EXPECT_FALSE(dialer_->dials(7));
    EXPECT_TRUE(dialer_->isAttempt(5, lastAttempt()));
    std::vector<int64_t> armed;
    for (int i = 0; i < 5; ++i) {
      dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kTimeout, "connect timed out"});
      EXPECT_FALSE(dialer_->isAttempt(5, lastAttempt()));
      armed.push_back(dialer_->armedRetry(5).count());
    }
    EXPECT_EQ(armed, (std::vector<int64_t>{100'000, 200'000, 400'000, 800'000, 800'000}));
    EXPECT_EQ(attempts_.size(), 1u) << "no retry before its timer";
  });
}

TEST_F(DialerTest, ALostPeerIsRedialedSoonAndALeftOneAfterTheLongestBackoff) {
  onLoop([this] {
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kTimeout, "timed out"});
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kTimeout, "timed out"});
    EXPECT_EQ(dialer_->armedRetry(5), milliseconds(200'000));
    // The retry's timer fires (here: called by hand) and the attempt succeeds.
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    EXPECT_EQ(attempts_.size(), 2u);
    dialer_->onEstablishedFromLoop(5, lastAttempt());
    EXPECT_FALSE(dialer_->isAttempt(5, lastAttempt()));
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    EXPECT_EQ(attempts_.size(), 2u) << "a connected peer is not dialed";
    dialer_->onLostFromLoop(5, /*left=*/false);
    EXPECT_EQ(dialer_->armedRetry(5), options_.dial_backoff_initial);
    dialer_->onLostFromLoop(5, /*left=*/true);
    EXPECT_EQ(dialer_->armedRetry(5), options_.dial_backoff_max);
  });
}

// Nothing listens at the peer's address yet (a peer still starting, or a crashed one being
// restarted): such attempts are retried at most an eighth of the longest backoff apart, so that
// the peer is connected soon after it listens; a time-out or a refused handshake in between
// still waits the doubled backoff.
TEST_F(DialerTest, AConnectRefusedAtTheSocketIsRetriedAtMostAnEighthOfTheLongestBackoffApart) {
  onLoop([this] {
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    std::vector<int64_t> armed;
    for (int i = 0; i < 4; ++i) {
      dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kIo, "connection refused"});
      armed.push_back(dialer_->armedRetry(5).count());
    }
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kTimeout, "connect timed out"});
    armed.push_back(dialer_->armedRetry(5).count());
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kRefused, "handshake refused"});
    armed.push_back(dialer_->armedRetry(5).count());
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kIo, "connection refused"});
    armed.push_back(dialer_->armedRetry(5).count());
    // Longest backoff 800 s: at most 100 s apart at the socket, doubling (to 800 s) otherwise.
    EXPECT_EQ(armed, (std::vector<int64_t>{100'000, 100'000, 100'000, 100'000, 800'000, 800'000,
                                           100'000}));
  });
}

TEST_F(DialerTest, APermanentRefusalEndsTheRetriesAndStopEndsThemAll) {
  onLoop([this] {
    dialer_->addFromLoop(5, sockaddr_storage{}, "host:1");
    dialer_->addFromLoop(7, sockaddr_storage{}, "host:1");
    dialer_->giveUpFromLoop(5);
    dialer_->onAttemptFailedFromLoop(5, "peer 5", {ErrorCode::kRefused, "another secret"});
    EXPECT_EQ(dialer_->armedRetry(5), milliseconds(0));
    dialer_->onAttemptFailedFromLoop(7, "peer 7", {ErrorCode::kIo, "refused"});
    EXPECT_EQ(dialer_->armedRetry(7), options_.dial_backoff_initial);
    dialer_->stopFromLoop();
    EXPECT_EQ(dialer_->armedRetry(7), milliseconds(0));
    dialer_->onLostFromLoop(7, false);
    EXPECT_EQ(dialer_->armedRetry(7), milliseconds(0)) << "nothing is armed after stop";
    EXPECT_EQ(attempts_, (std::vector<NodeId>{5, 7}));
  });
}

}  // namespace
}  // namespace chorus::node
