// JSON-lines metrics (one object per event, flushed per line) and a progress reporter that
// redraws one live line on a terminal and prints plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::ml {

// One metrics event: {"event": NAME, "time": seconds, ...fields in insertion order}.
class MetricsEvent {
 public:
  // `name` says what happened ("step", "epoch", "summary", ...).
  explicit MetricsEvent(std::string_view name);
  // Adds a number field (non-finite numbers are written as null: JSON has no NaN).
  MetricsEvent& add(std::string_view key, double value);
  // Adds an integer field.
  MetricsEvent& add(std::string_view key, int64_t value);
  MetricsEvent& add(std::string_view key, int value) { return add(key, int64_t{value}); }
  MetricsEvent& add(std::string_view key, uint64_t value);
  // Adds a string field (escaped).
  MetricsEvent& add(std::string_view key, std::string_view value);
  MetricsEvent& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  // Adds a boolean field.
  MetricsEvent& addBool(std::string_view key, bool value);
  // Adds an already-serialized JSON value (array, object) verbatim.
  MetricsEvent& addRaw(std::string_view key, std::string_view json);
  // The event's name.
  const std::string& name() const { return name_; }
  // The fields after "event" and "time", serialized ("," separated, no braces).
  const std::string& fields() const { return fields_; }

 private:
  void key(std::string_view key);
  std::string name_;
  std::string fields_;
};

// Quotes and escapes a string for JSON.
std::string jsonString(std::string_view text);

// Appends one JSON object per event to a file; "time" is seconds since the writer was created.
// A writer with no path drops events. Not thread-safe; each node/trainer owns one.
class MetricsWriter {
 public:
  // Opens `path`, truncated, or appended to with `append` (a node that rejoins keeps the lines
  // of its earlier life); an empty path makes a writer that writes nothing. Throws
  // std::runtime_error naming the path when it cannot be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Writes the event as one line and flushes it.
  void write(const MetricsEvent& event);
  // Seconds since construction.
  double elapsed() const;
  // Whether events go anywhere.
  bool enabled() const { return file_ != nullptr; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  std::chrono::steady_clock::time_point start_;
};

// Progress for a human: on a terminal, update() redraws one line in place (at most ~10 times a
// second); otherwise update() prints a plain line at most every `plainInterval`. line() always
// prints a full line (clearing the live one first).
class ProgressReporter {
 public:
  // Writes to `out`; `live` says whether it is a terminal (see isTerminal()).
  ProgressReporter(std::FILE* out, bool live,
                   std::chrono::milliseconds plainInterval = std::chrono::seconds(10));
  // Shows the current status.
  void update(const std::string& status);
  // Prints a permanent line.
  void line(const std::string& text);
  // Ends a live line, if one is showing.
  void finish();
  // Whether `file` is a terminal.
  static bool isTerminal(std::FILE* file);

 private:
  std::FILE* out_;
  bool live_;
  bool showing_ = false;
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace chorus::ml
