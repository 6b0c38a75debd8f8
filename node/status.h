// Error values of the peer runtime: what failed, as data. Programming bugs are asserts instead
// (docs/errors.md).
#pragma once

#include <string>
#include <string_view>

namespace chorus::node {

enum class ErrorCode {
  kOk = 0,
  kBadFrame,         // bytes from a peer that are not a valid frame
  kProtocol,         // a valid frame that breaks the protocol (wrong sender, Hello twice, ...)
  kRefused,          // the handshake was refused (by us or by the peer)
  kTimeout,          // a deadline passed (connect, handshake, heartbeat, cluster ready)
  kClosed,           // the connection closed (EOF, reset, closed by us)
  kPeerLeft,         // the peer said Leave
  kNotConnected,     // no established connection to that peer
  kShutdown,         // the node is shutting down or stopped
  kIo,               // a libuv / socket error
  kInvalidArgument,  // bad options or arguments from the caller
  kOverloaded,       // the node refused to hold more (inbound budget, handshake cap)
};

// Short name of a code, e.g. "bad-frame".
const char* errorCodeName(ErrorCode code);

// An error value: a code plus a message for humans. Default-constructed means success.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  // True when no error.
  bool ok() const { return code_ == ErrorCode::kOk; }
  // The error code (kOk on success).
  ErrorCode code() const { return code_; }
  // The human-readable reason ("" on success).
  const std::string& message() const { return message_; }
  // "<code>: <message>" or "ok".
  std::string toString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

}  // namespace chorus::node
