// The topology loader on untrusted text: the text guard, toml++ and chorus's own checks. A
// TopologyError is the documented answer to a bad file; anything else escapes and is a crash.
// checkTopology() must never throw.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "topology/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = chorus::fuzz::asText(data, size);
  auto diagnostics = chorus::topology::checkTopology(text, "fuzz.toml");
  try {
    auto topology = chorus::topology::parseTopology(text, "fuzz.toml");
    // A file that parses must summarize and print without surprises, and print back to an
    // equivalent topology.
    (void)chorus::topology::summarize(topology);
    auto again = chorus::topology::parseTopology(chorus::topology::toToml(topology), "again.toml");
    if (!chorus::topology::equivalent(topology, again)) __builtin_trap();
    if (!diagnostics.empty()) __builtin_trap();  // check and parse must agree
  } catch (const chorus::topology::TopologyError&) {
    if (diagnostics.empty()) __builtin_trap();
  }
  return 0;
}
