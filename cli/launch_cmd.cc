#include "cli/commands.h"
namespace chorus::cli {
void addLaunchCommand(CLI::App&) {}
}  // namespace chorus::cli
