// Ports for the runs `chorus compare` starts one after another on this machine: each run gets
// ports that were free a moment before it starts, instead of the topology file's, so that a
// port some other program took (another test, a run still closing its sockets) does not fail a
// run in the middle of a comparison.
#pragma once

#include <cstdint>
#include <vector>

#include "node/result.h"
#include "topology/topology.h"

namespace chorus::cli {

// `count` distinct TCP ports free on every local address right now (bound on the wildcard
// address, then released). Ports are drawn below the kernel's ephemeral range, which outgoing
// connections take their local ports from, so a dialing node does not take one between this
// call and the node's listen(); the kernel's own pick (port 0) when that range leaves no room.
// kIo when no socket can be bound.
node::Result<std::vector<uint16_t>> freePorts(size_t count);

// `topology` with every node on a port of freePorts() (same hosts, ids, neighbors and
// attributes), and its secret_file made absolute, so that the copy can be written to another
// folder (toToml()) and read there.
node::Result<topology::Topology> withFreePorts(topology::Topology topology);

}  // namespace chorus::cli
