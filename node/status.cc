#include "node/status.h"

namespace chorus::node {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kBadFrame:
      return "bad-frame";
    case ErrorCode::kProtocol:
      return "protocol";
    case ErrorCode::kRefused:
      return "refused";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kClosed:
      return "closed";
    case ErrorCode::kPeerLeft:
      return "peer-left";
    case ErrorCode::kNotConnected:
      return "not-connected";
    case ErrorCode::kShutdown:
      return "shutdown";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kInvalidArgument:
      return "invalid-argument";
    case ErrorCode::kOverloaded:
      return "overloaded";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (ok()) return "ok";
  return std::string(errorCodeName(code_)) + ": " + message_;
}

}  // namespace chorus::node
