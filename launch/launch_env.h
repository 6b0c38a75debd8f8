// The node id handed over by an existing launcher (Open MPI, MPICH/PMI, Slurm), and whether
// this process runs under one. Read once by the command line; the runtime does not know it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "node/status.h"

namespace chorus::launch {

using node::Status;

// A rank read from the environment, and which variable it came from.
struct LauncherRank {
  uint32_t rank = 0;
  std::string variable;  // e.g. "OMPI_COMM_WORLD_RANK"
};

// Reads an environment variable (nullptr when unset); injectable for tests.
using EnvironmentLookup = std::function<const char*(const char* name)>;

// The variables consulted, in order.
inline constexpr const char* kRankVariables[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                                 "SLURM_PROCID"};

// Sets *rank from the first of kRankVariables that is set. Leaves it empty when none is set;
// an error when the first set variable is not a non-negative 32-bit integer.
Status rankFromEnvironment(const EnvironmentLookup& lookup, std::optional<LauncherRank>* rank);

// True when any of kRankVariables is set (mpirun or srun started this process) or NO_COLOR is
// (no-color.org): then logs carry no colour codes (NodeOptions::log_color), since launchers mix
// their ranks' lines into one stream where the codes show raw.
bool plainLogs(const EnvironmentLookup& lookup);

}  // namespace chorus::launch
