// A value or the error that kept it from being made: the value-returning partner of Status
// (node/status.h), for code above node/ that parses, reads or checks outside input (flags,
// files, specs). docs/errors.md, "One style above node/". Header only, no dependencies beyond
// status.h's inline part, so grammar libraries (faults/) use it without linking the runtime.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "node/status.h"

namespace chorus::node {

// Either a T or a failed Status, never both. A Result built from an ok Status is a bug
// (asserted): success always carries its value.
template <class T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is a Status");

 public:
  // Success.
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // Failure; `error` must not be ok.
  Result(Status error) : error_(std::move(error)) {  // NOLINT(google-explicit-constructor)
    assert(!error_.ok());
  }

  // True when the value is there.
  bool ok() const { return value_.has_value(); }
  // The error (ok() when the value is there).
  const Status& status() const { return error_; }
  // The error's message ("" on success): what the edge prints.
  const std::string& message() const { return error_.message(); }

  // The value; requires ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status error_;
};

// The error of bad outside input (a flag, a file's text, a spec field), named by `message`.
inline Status invalidInput(std::string message) {
  return Status(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace chorus::node
