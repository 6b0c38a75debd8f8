#include "cli/commands.h"
namespace chorus::cli {
void addTopoCommands(CLI::App&) {}
}  // namespace chorus::cli
