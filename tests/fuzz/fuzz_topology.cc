// The topology loader on untrusted text: the text guard, toml++ and chorus's own checks. An error
// Result is the documented answer to a bad file; anything that escapes is a crash. Neither
// parseTopology() nor checkTopology() may throw.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "topology/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = chorus::fuzz::asText(data, size);
  auto diagnostics = chorus::topology::checkTopology(text, "fuzz.toml");
  auto parsed = chorus::topology::parseTopology(text, "fuzz.toml");
  if (!parsed.ok()) {
    if (diagnostics.empty()) __builtin_trap();  // check and parse must agree
    return 0;
  }
  const chorus::topology::Topology& topology = *parsed;
  // A file that parses must summarize and print without surprises, and print back to an
  // equivalent topology.
  (void)chorus::topology::summarize(topology);
  auto again = chorus::topology::parseTopology(chorus::topology::toToml(topology), "again.toml");
  if (!again.ok() || !chorus::topology::equivalent(topology, *again)) __builtin_trap();
  if (!diagnostics.empty()) __builtin_trap();  // check and parse must agree
  return 0;
}
