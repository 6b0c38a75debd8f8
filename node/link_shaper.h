// Link shaping (fault injection, docs/stragglers.md): a layer between a connection's write
// queue and its socket that holds every frame back for a delay, a seeded jitter and, with a
// loss probability, the retransmission time-outs a lost segment costs TCP, and lets frames
// through in order. Loopback has almost no latency; real clusters do. Internal header; loop
// thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <vector>

#include "node/frame.h"
#include "node/options.h"
#include "node/status.h"
#include "node/uv_handles.h"

namespace chorus::node {

// One frame queued on a connection, with its completion.
struct QueuedWrite {
  SharedFrame frame;
  std::function<void(const Status&)> done;
  size_t written_before = 0;  // bytes of the same frame the socket took at once
  uint32_t kind = 0;          // SendOptions::kind (which older frames a newer one supersedes)
  bool seal = false;          // sealed (node/frame_cipher.h) when it is handed to the socket
};

// What one link does to the frames sent over it.
struct LinkShape {
  std::chrono::microseconds delay{0};   // every frame waits at least this long
  std::chrono::microseconds jitter{0};  // plus a uniform draw from [0, jitter)
  double loss = 0;                      // with this probability a frame draws a loss ...
  std::chrono::microseconds rto{0};     // ... and waits this much more, doubled per further loss
  uint64_t seed = 1;                    // seeds the jitter and loss draws

  // Any fault set: every frame goes through the shaper.
  bool active() const { return delay.count() > 0 || jitter.count() > 0 || loss > 0; }
};

class LinkShaper {
 public:
  using Clock = std::chrono::steady_clock;
  struct Held {
    Clock::time_point due;
    QueuedWrite write;
  };
  // `release` takes the writes that are due, in order; `on_lost` counts a frame that drew a
  // loss. Both run on the loop thread.
  LinkShaper(uv_loop_t* loop, const LinkShape& shape,
             std::function<void(std::vector<QueuedWrite>)> release, std::function<void()> on_lost);
  LinkShaper(const LinkShaper&) = delete;
  LinkShaper& operator=(const LinkShaper&) = delete;

  bool active() const { return shape_.active(); }
  // Holds `write` for its draw (never overtaking an earlier frame: TCP delivers in order).
  void holdFromLoop(QueuedWrite write);
  // Releases what is due now (everything with `all`: a closing link does not hold its last
  // frames back) and arms the timer for the rest.
  void releaseFromLoop(bool all);
  // Every held write, in order, taken out (the connection failed).
  std::vector<QueuedWrite> takeAllFromLoop();
  // The held writes, oldest first; the connection may remove some (superseded frames).
  std::deque<Held>& held() { return held_; }
  // Stops the timer for good (the connection closes).
  void stopFromLoop() { timer_.reset(); }

 private:
  uv_loop_t* loop_;
  LinkShape shape_;
  std::function<void(std::vector<QueuedWrite>)> release_;
  std::function<void()> on_lost_;
  std::mt19937_64 rng_;
  std::deque<Held> held_;  // due times never decrease
  uv::HandlePtr<uv::Timer> timer_;
};

}  // namespace chorus::node
