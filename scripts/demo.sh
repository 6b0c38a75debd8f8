#!/usr/bin/env bash
# The README's main command: a 4-node chorus cluster on this machine, started from a shipped
# topology file. The nodes connect over TCP, shake hands, exchange verified messages, and leave
# in order; the launcher prints each node's report and exits non-zero if any node failed.
set -euo pipefail
chorus=${1:-build/cli/chorus}
topology=examples/topologies/demo4.toml
cd "$(dirname "$0")/.."
echo "demo: $chorus launch $topology --mode ping --pings 20"
"$chorus" launch "$topology" --mode ping --pings 20 --log-level warn
