// "Did you mean ...?" for a mistyped command or flag: the nearest known name by edit distance.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace chorus::cli {

// The name in `names` nearest to `word` (Levenshtein distance), when it is near enough to be a
// typo: at most 2 edits, and fewer than a third of the word's length for short words. Empty
// otherwise.
std::string nearestName(std::string_view word, const std::vector<std::string>& names);

// For the words of a command line `args` (without the program name) that `app` refused: a
// "did you mean" line for the first unknown subcommand or --flag that has a near known one, or
// empty. Descends into subcommands the words name (`chorus topo gen ...`).
std::string suggestFor(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace chorus::cli
