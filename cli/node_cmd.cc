#include "cli/commands.h"
namespace chorus::cli {
void addNodeCommands(CLI::App&) {}
}  // namespace chorus::cli
