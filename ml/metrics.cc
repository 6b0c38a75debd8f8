#include "ml/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace chorus::ml {

std::string jsonString(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (const char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

MetricsEvent::MetricsEvent(std::string_view name) : name_(name) {}

void MetricsEvent::key(std::string_view key) {
  fields_ += ',';
  fields_ += jsonString(key);
  fields_ += ':';
}

MetricsEvent& MetricsEvent::add(std::string_view name, double value) {
  key(name);
  fields_ += std::isfinite(value) ? fmt::format("{}", value) : "null";
  return *this;
}

MetricsEvent& MetricsEvent::add(std::string_view name, int64_t value) {
  key(name);
  fields_ += fmt::format("{}", value);
  return *this;
}

MetricsEvent& MetricsEvent::add(std::string_view name, uint64_t value) {
  key(name);
  fields_ += fmt::format("{}", value);
  return *this;
}

MetricsEvent& MetricsEvent::add(std::string_view name, std::string_view value) {
  key(name);
  fields_ += jsonString(value);
  return *this;
}

MetricsEvent& MetricsEvent::addBool(std::string_view name, bool value) {
  key(name);
  fields_ += value ? "true" : "false";
  return *this;
}

MetricsEvent& MetricsEvent::addRaw(std::string_view name, std::string_view json) {
  key(name);
  fields_ += json;
  return *this;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), start_(std::chrono::steady_clock::now()) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr) {
    throw std::runtime_error(fmt::format("cannot write metrics to {}: {}", path,
                                         std::generic_category().message(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

double MetricsWriter::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void MetricsWriter::write(const MetricsEvent& event) {
  if (file_ == nullptr) return;
  const std::string line = fmt::format("{{\"event\":{},\"time\":{:.6f}{}}}\n",
                                       jsonString(event.name()), elapsed(), event.fields());
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw std::runtime_error(fmt::format("cannot write metrics to {}: {}", path_,
                                         std::generic_category().message(errno)));
  }
}

ProgressReporter::ProgressReporter(std::FILE* out, bool live, std::chrono::milliseconds interval)
    : out_(out), live_(live), interval_(interval) {}

bool ProgressReporter::isTerminal(std::FILE* file) {
  return isatty(fileno(file)) != 0;
}

void ProgressReporter::update(const std::string& status) {
  const auto now = std::chrono::steady_clock::now();
  if (live_) {
    if (showing_ && now - last_ < std::chrono::milliseconds(100)) return;
    // \r back to column 0, \x1b[K clears what a longer previous line left behind.
    std::fprintf(out_, "\r%s\x1b[K", status.c_str());
    showing_ = true;
  } else {
    if (last_ != std::chrono::steady_clock::time_point{} && now - last_ < interval_) return;
    std::fprintf(out_, "%s\n", status.c_str());
  }
  last_ = now;
  std::fflush(out_);
}

void ProgressReporter::line(const std::string& text) {
  if (live_ && showing_) {
    std::fprintf(out_, "\r\x1b[K");
    showing_ = false;
  }
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressReporter::finish() {
  if (live_ && showing_) {
    std::fprintf(out_, "\n");
    showing_ = false;
    std::fflush(out_);
  }
}

}  // namespace chorus::ml
