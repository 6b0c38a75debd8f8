#include "cli/commands.h"
namespace chorus::cli {
void addTrainCommand(CLI::App&) {}
}  // namespace chorus::cli
