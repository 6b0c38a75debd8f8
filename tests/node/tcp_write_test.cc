// Writes cut into slices: the cut itself, the slice a connection's MSS gives, and a batch of
// frames written in small slices over a real loopback connection.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <vector>

#include "node/uv_handles.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using testing::makePing;

std::vector<SharedFrame> framesOfSizes(const std::vector<size_t>& payloads) {
  std::vector<SharedFrame> frames;
  frames.reserve(payloads.size());
  uint64_t nonce = 0;
  for (size_t payload : payloads)
    frames.push_back(makePing(1, "c", ++nonce, payload));
  return frames;
}

std::vector<uint8_t> concatenated(const std::vector<SharedFrame>& frames) {
  std::vector<uint8_t> bytes;
  for (const auto& frame : frames)
    for (const auto& piece : frame->pieces())
      bytes.insert(bytes.end(), piece.begin(), piece.end());
  return bytes;
}

TEST(SliceForWrites, EveryWriteButTheLastIsFullAndTheBytesStayInOrder) {
  const auto frames = framesOfSizes({10, 300'000, 5, 70'000});
  const auto writes = uv::sliceForWrites(frames, 1000);
  std::vector<uint8_t> sent;
  for (size_t i = 0; i < writes.size(); ++i) {
    size_t bytes = 0;
    for (const uv_buf_t& buf : writes[i]) {
      bytes += buf.len;
      sent.insert(sent.end(), buf.base, buf.base + buf.len);
    }
    if (i + 1 < writes.size()) {
      EXPECT_EQ(bytes, 1000U) << "write " << i;
    } else {
      EXPECT_LE(bytes, 1000U);
      EXPECT_GT(bytes, 0U);
    }
  }
  EXPECT_EQ(sent, concatenated(frames));
}

TEST(SliceForWrites, AttachmentPiecesAreCutLikeTheEnvelope) {
  std::vector<uint8_t> a(70'000), b(3);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<uint8_t>(i * 7);
  b = {1, 2, 3};
  EnvelopeHeader header{1, "c", 1, 0};
  std::vector<SharedFrame> frames{
      encodeFrame(
          header, wire::Body::Heartbeat,
          [](flatbuffers::FlatBufferBuilder& fb) { return wire::CreateHeartbeat(fb, 5).Union(); },
          0, {std::span<const uint8_t>(a), std::span<const uint8_t>(b)}),
      framesOfSizes({10})[0]};
  const auto writes = uv::sliceForWrites(frames, 1000);
  std::vector<uint8_t> sent;
  for (const auto& write : writes) {
    for (const uv_buf_t& buf : write)
      sent.insert(sent.end(), buf.base, buf.base + buf.len);
  }
  EXPECT_EQ(sent, concatenated(frames));
  EXPECT_EQ(sent.size(), frames[0]->envelopeSize() + a.size() + b.size() + frames[1]->size());
}

TEST(SliceForWrites, NoSliceKeepsOneWriteWithOneBufferPerFrame) {
  const auto frames = framesOfSizes({10, 300'000, 5});
  const auto writes = uv::sliceForWrites(frames, 0);
  ASSERT_EQ(writes.size(), 1U);
  ASSERT_EQ(writes[0].size(), 3U);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(writes[0][i].len, frames[i]->size());
}

TEST(WriteSliceFor, TwoOfTheLargestPacketsOfWholeSegments) {
  EXPECT_EQ(uv::writeSliceFor(65'483, 2), 2U * 65'483);     // loopback: one segment per packet
  EXPECT_EQ(uv::writeSliceFor(32'768, 2), 2U * 32'768);     // loopback's first MSS: still one
  EXPECT_EQ(uv::writeSliceFor(1'448, 2), 2U * 45 * 1'448);  // Ethernet: 45 segments per packet
  EXPECT_EQ(uv::writeSliceFor(8'948, 2), 2U * 7 * 8'948);   // jumbo frames
  EXPECT_EQ(uv::writeSliceFor(100'000, 2), 200'000U);       // a segment beyond 64 KiB still counts
  EXPECT_EQ(uv::writeSliceFor(0, 2), 0U);                   // unknown MSS: no cap
}

TEST(WriteSliceFor, OtherPacketCountsAndNone) {
  EXPECT_EQ(uv::writeSliceFor(65'483, 1), 65'483U);
  EXPECT_EQ(uv::writeSliceFor(1'448, 4), 4U * 45 * 1'448);
  EXPECT_EQ(uv::writeSliceFor(1'448, 0), 0U);
  // The smallest packet bounds every slice from below, which lets a small write skip the MSS.
  for (size_t mss : {536U, 1'448U, 9'000U, 32'607U, 32'608U, 32'768U, 65'483U, 70'000U}) {
    EXPECT_GE(uv::writeSliceFor(mss, 1), uv::kSmallestPacketPayload) << "MSS " << mss;
  }
}

// A listener, a dialer and the accepted end on one loop run by the test thread.
class LoopbackPair {
 public:
  LoopbackPair() {
    // As Node does before it opens a socket: a write to a vanished peer fails with EPIPE
    // instead of killing the process.
    std::signal(SIGPIPE, SIG_IGN);
    uv_loop_init(&loop_);
    listener_ = uv::Tcp::create(&loop_);
    dialer_ = uv::Tcp::create(&loop_);
    accepted_ = uv::Tcp::create(&loop_);
    sockaddr_in address{};
    uv_ip4_addr("127.0.0.1", 0, &address);
    EXPECT_TRUE(listener_->bindFromLoop(reinterpret_cast<const sockaddr*>(&address)).ok());
    EXPECT_TRUE(listener_
                    ->listenFromLoop(1,
                                     [this](const Status& status) {
                                       ASSERT_TRUE(status.ok());
                                       ASSERT_TRUE(listener_->acceptFromLoop(*accepted_).ok());
                                       accepted_ready_ = true;
                                     })
                    .ok());
    address.sin_port = htons(listener_->localPortFromLoop());
    EXPECT_TRUE(dialer_
                    ->connectFromLoop(reinterpret_cast<const sockaddr*>(&address),
                                      [this](const Status& status) {
                                        ASSERT_TRUE(status.ok());
                                        dialer_ready_ = true;
                                      })
                    .ok());
    runUntil([this] { return dialer_ready_ && accepted_ready_; });
  }
  ~LoopbackPair() {
    listener_.reset();
    dialer_.reset();
    accepted_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);  // the close callbacks
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  LoopbackPair(const LoopbackPair&) = delete;
  LoopbackPair& operator=(const LoopbackPair&) = delete;

  // Runs the loop until `done` holds; every wait here is on loopback and ends within ms.
  template <typename Done>
  void runUntil(Done done) {
    while (!done())
      uv_run(&loop_, UV_RUN_ONCE);
  }

  uv::Tcp& dialer() { return *dialer_; }
  uv::Tcp& accepted() { return *accepted_; }
  void closeAccepted() { accepted_.reset(); }

 private:
  uv_loop_t loop_{};
  uv::HandlePtr<uv::Tcp> listener_, dialer_, accepted_;
  bool dialer_ready_ = false, accepted_ready_ = false;
};

TEST(TcpWrite, ABatchInManySlicesArrivesWholeAndCompletesOnce) {
  LoopbackPair pair;
  EXPECT_GT(pair.dialer().maxSegmentFromLoop(), 0U);
  pair.dialer().setWriteSliceFromLoop(1000);
  const auto frames = framesOfSizes({10, 300'000, 5, 70'000});
  const std::vector<uint8_t> expected = concatenated(frames);

  std::vector<uint8_t> received;
  std::vector<uint8_t> scratch(64 * 1024);
  ASSERT_TRUE(pair.accepted()
                  .readStartFromLoop([&] { return std::span<uint8_t>(scratch); },
                                     [&](ssize_t n) {
                                       ASSERT_GT(n, 0);
                                       received.insert(received.end(), scratch.data(),
                                                       scratch.data() + n);
                                     })
                  .ok());
  int completions = 0;
  Status outcome{ErrorCode::kIo, "not completed"};
  ASSERT_TRUE(pair.dialer()
                  .writeFromLoop(frames,
                                 [&](const Status& status) {
                                   ++completions;
                                   outcome = status;
                                 })
                  .ok());
  pair.runUntil([&] { return completions > 0 && received.size() >= expected.size(); });
  EXPECT_EQ(completions, 1);
  EXPECT_TRUE(outcome.ok()) << outcome.message();
  EXPECT_EQ(received, expected);
}

TEST(TcpWrite, EverySlicedBatchToAVanishedPeerCompletesOnceWithAnError) {
  LoopbackPair pair;
  pair.dialer().setWriteSliceFromLoop(1000);
  pair.closeAccepted();
  const auto frames = framesOfSizes({300'000});
  size_t issued = 0;
  size_t completed = 0;
  std::optional<Status> failure;
  // The first batches may still fit the socket buffers; the reset arrives soon after.
  while (!failure) {
    const Status status = pair.dialer().writeFromLoop(frames, [&](const Status& outcome) {
      ++completed;
      if (!outcome.ok() && !failure) failure = outcome;
    });
    if (!status.ok()) break;
    ++issued;
    pair.runUntil([&] { return completed == issued || failure.has_value(); });
  }
  pair.runUntil([&] { return completed == issued; });
  EXPECT_EQ(completed, issued);
  ASSERT_TRUE(failure.has_value());
  EXPECT_FALSE(failure->ok());
}

TEST(TcpWrite, NoFramesIsAnErrorAndNoCallback) {
  LoopbackPair pair;
  bool called = false;
  const Status status = pair.dialer().writeFromLoop({}, [&](const Status&) { called = true; });
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace chorus::node
