// Entry point of the single `chorus` executable.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/suggest.h"

int main(int argc, char** argv) {
  CLI::App app{
      "chorus: decentralized peer-to-peer training. N identical nodes train one model together,\n"
      "either with sharded parameter ownership (PS mode) or by gossip averaging (consensus mode).",
      "chorus"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "chorus 0.1.0");
  chorus::cli::addTopoCommands(app);
  chorus::cli::addNodeCommands(app);
  chorus::cli::addLaunchCommand(app);
  chorus::cli::addTrainCommand(app);
  chorus::cli::addCompareCommand(app);
  chorus::cli::addReportCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); a bad flag or value then exits 2 like every
    // other bad input of chorus, not with CLI11's own code for the kind of error (105, 106...).
    if (app.exit(e) == 0) return 0;
    const std::string hint =
        chorus::cli::suggestFor(app, std::vector<std::string>(argv + 1, argv + argc));
    if (!hint.empty()) std::fprintf(stderr, "chorus: %s\n", hint.c_str());
    return 2;
  } catch (const chorus::cli::CommandFailure& e) {
    if (e.what()[0] != '\0') std::fprintf(stderr, "chorus: error: %s\n", e.what());
    return e.code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
