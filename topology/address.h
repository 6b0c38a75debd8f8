// Parsing and checking of node addresses ("host:port"), shared by the loader and the generators.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace chorus::topology {

// A listening address split into its parts; an IPv6 host is kept without its brackets.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// Why an address string was refused, and what to write instead.
struct AddressProblem {
  std::string message;
  std::string fix;
};

// Splits and checks "host:port" where host is an IPv4 address, a host name or "[IPv6]" and port
// is 1..65535.
std::variant<Endpoint, AddressProblem> parseEndpoint(std::string_view address);

// Checks a host on its own (IPv4, host name, or an IPv6 literal with or without brackets);
// returns the host as NodeSpec keeps it, or the problem.
std::variant<std::string, AddressProblem> checkHost(std::string_view host);

// The address a host makes a node listen on, for telling whether two nodes would bind the same
// socket: literal addresses are compared in binary form (::ffff:a.b.c.d as a.b.c.d), "localhost"
// as 127.0.0.1 (nodes resolve names preferring IPv4), other names by their lowercase spelling.
struct ListeningHost {
  std::string key;        // equal keys bind the same address
  bool wildcard = false;  // 0.0.0.0 or ::, which takes the port on every local address
};
// `host` as NodeSpec keeps it (no brackets).
ListeningHost listeningHostOf(std::string_view host);

// "host:port", bracketing an IPv6 host.
std::string formatEndpoint(std::string_view host, uint16_t port);

}  // namespace chorus::topology
