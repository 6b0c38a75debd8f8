#include "node/address.h"

#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

namespace chorus::node {

Status resolveAddress(const std::string& host, uint16_t port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("cannot resolve host \"{}\": {}", host, gai_strerror(rc))};
  }
  // Prefer IPv4: "localhost" then means 127.0.0.1 on every machine.
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(found);
  return {};
}

std::shared_ptr<spdlog::logger> makeNodeLogger(const NodeOptions& options) {
  std::vector<spdlog::sink_ptr> sinks = options.log_sinks;
  if (sinks.empty()) {
    // Colour only for a person at a terminal: the command line turns it off under mpirun and
    // srun (they mix the ranks' lines into one stream, where the codes show raw), and NO_COLOR
    // (no-color.org) turns it off too.
    static const auto colored = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(
        std::getenv("NO_COLOR") != nullptr ? spdlog::color_mode::never
                                           : spdlog::color_mode::automatic);
    static const auto plain =
        std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::never);
    sinks.push_back(options.log_color ? colored : plain);
  }
  auto logger = std::make_shared<spdlog::logger>(fmt::format("node {}", options.self),
                                                 sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(options.log_level);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace chorus::node
