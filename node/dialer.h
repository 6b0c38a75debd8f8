// The dialing side of the runtime: which peers this node dials (the higher ids it was told to
// connect to), the attempt under way for each, and when to try again: capped exponential
// backoff after a failed attempt, the longest backoff after a peer left, never again after a
// permanent refusal. Opening the connection itself is the node's (a callback). Internal header;
// loop thread only.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "node/options.h"
#include "node/status.h"
#include "node/uv_handles.h"

namespace spdlog {
class logger;
}

namespace chorus::node {

class Connection;

class Dialer {
 public:
  // Opens one attempt to `peer` at `address` and returns its connection (never null).
  using OpenAttempt = std::function<Connection*(NodeId peer, const sockaddr_storage& address,
                                                const std::string& address_text)>;
  Dialer(uv_loop_t* loop, const NodeOptions& options, spdlog::logger& log, OpenAttempt open);
  Dialer(const Dialer&) = delete;
  Dialer& operator=(const Dialer&) = delete;

  // Dials `peer` now and again after every loss, until stopFromLoop().
  void addFromLoop(NodeId peer, const sockaddr_storage& address, std::string address_text);
  // True when this node dials `peer`.
  bool dials(NodeId peer) const { return targets_.contains(peer); }
  // True when `connection` is the attempt under way to its peer.
  bool isAttempt(NodeId peer, const Connection* connection) const;
  // The attempt's handshake completed: it is the peer's connection now; backoff starts over.
  void onEstablishedFromLoop(NodeId peer, const Connection* connection);
  // The attempt failed (`why`): try again after the backoff, which doubles up to the maximum;
  // a failure at the socket (ErrorCode::kIo: nothing listens there yet) waits at most an
  // eighth of the maximum.
  void onAttemptFailedFromLoop(NodeId peer, const std::string& description, const Status& why);
  // The established connection was lost: redial after the shortest backoff, or after the
  // longest when the peer left (it comes back as a new process, if at all).
  void onLostFromLoop(NodeId peer, bool left);
  // A permanent refusal: never dial `peer` again.
  void giveUpFromLoop(NodeId peer);
  // No more attempts: stops every redial timer (leaving or stopped).
  void stopFromLoop();
  // The delay of the retry armed for `peer` (0: none armed); for tests and logs.
  std::chrono::milliseconds armedRetry(NodeId peer) const;

 private:
  struct Target {
    sockaddr_storage address{};
    std::string address_text;
    const Connection* attempt = nullptr;  // dial attempt in progress
    bool connected = false;
    bool gave_up = false;
    std::chrono::milliseconds backoff{0};
    std::chrono::milliseconds armed{0};  // the retry waiting on redial_timer, 0: none
    uv::HandlePtr<uv::Timer> redial_timer;
  };
  void dialFromLoop(NodeId peer);
  void scheduleFromLoop(NodeId peer, std::chrono::milliseconds delay);

  uv_loop_t* loop_;
  const NodeOptions& options_;
  spdlog::logger& log_;
  OpenAttempt open_;
  std::map<NodeId, Target> targets_;
  bool stopped_ = false;
};

}  // namespace chorus::node
