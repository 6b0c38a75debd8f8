// Checks of float values that came from another node (docs/errors.md, "Values from peers"):
// one branch-free pass that the compiler vectorizes, so a 4 MB tensor costs about a memory
// read, and the index of the first offender only when the pass found one.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

namespace chorus::node {

// True when no value is NaN or infinite.
bool allFinite(std::span<const float> values);
// The index of the first NaN or infinite value, or nullopt.
std::optional<size_t> firstNonFinite(std::span<const float> values);
// How many values are NaN or infinite.
size_t countNonFinite(std::span<const float> values);

}  // namespace chorus::node
