// Turning a host and port into a socket address, and the node's logger. Both run on the
// calling thread, never the loop thread (getaddrinfo blocks).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

#include "node/options.h"
#include "node/status.h"

namespace spdlog {
class logger;
}

namespace chorus::node {

// Resolves host:port (IPv4 preferred, so "localhost" is 127.0.0.1 everywhere); an error names
// the host.
Status resolveAddress(const std::string& host, uint16_t port, sockaddr_storage* out);

// The logger of node options.self ("[node 3]"), on options.log_sinks or one stderr sink shared
// by every node of the process (so lines never interleave).
std::shared_ptr<spdlog::logger> makeNodeLogger(const NodeOptions& options);

}  // namespace chorus::node
