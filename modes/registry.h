// The modes chorus runs, one entry each: its name (as `--mode` and compare's variants say it),
// a one-line description, the service its messages travel as (docs/wire-format.md,
// "Services"), whether `--mode` takes it and whether it trains, the checks of its options and
// its share of the run fingerprint, and how `chorus node` builds it: a session factory for a
// mode that does not train (ping), a two-step training plan for one that does (image models;
// modes/session.h), and which sparse session it runs for the sparse models. The wire ids of
// every mode are checked here to be distinct, once, for all. Adding a mode: its folder and one
// line here (docs/architecture.md, "Adding a mode").
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "modes/session.h"
#include "modes/variants.h"
#include "node/result.h"
#include "node/service.h"

namespace chorus::modes {

// "key=value" pairs every node of a cluster must run alike (NodeOptions::run_fingerprint).
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

struct Mode {
  std::string_view name;
  std::string_view description;
  // The service its messages travel as; null for a mode that sends none (single).
  const node::ServiceSpec* service = nullptr;
  // `--mode NAME` runs it (single is not named: a topology of one node trains alone).
  bool named_by_flag = true;
  // It trains (reads a data set): its session is the CLI's training run.
  bool trains = true;
  // The checks of its settings that need no data and no port (null: none) (launch runs them before
  // any node starts): an error (kInvalidArgument) naming the flag. For a mode that trains, run
  // after the checks every training run shares.
  node::Status (*check)(const ModeSettings&) = nullptr;
  // Its settings every node must share (null: none of its own), for the handshake (after the
  // settings every training run shares, which the CLI writes, for a mode that trains).
  Fingerprint (*fingerprint)(const ModeSettings&) = nullptr;
  // A mode that does not train: its session on a started node (null for the training modes).
  std::unique_ptr<Session> (*make_session)(const SessionContext&, const ModeSettings&) = nullptr;
  // A mode that trains image (dense) models: step 1 of its plan (modes/session.h), which loads
  // the node's data before the node exists; the plan's `start` is step 2. Null: it does not.
  // An error is bad settings (kInvalidArgument: exit 2) or unreadable data (exit 1).
  node::Result<TrainingPlan> (*plan)(const TrainingContext&) = nullptr;
  // Which session the sparse models (complex, distmult, mf) train in (kNone: it refuses them).
  SparseTraining sparse = SparseTraining::kNone;
  // A topology of one node runs this mode instead of the named one, when it trains the model's
  // family (single: training alone, with no peers). At most one mode has it.
  bool alone = false;
  // `chorus compare`'s variants of this mode (modes/variants.h): the grammar of ARGS in a
  // variant named NAME or NAME:ARGS, and its forms for --help and errors. Null: no variants.
  node::Result<VariantSpec> (*parse_variant)(std::optional<std::string_view> args) = nullptr;
  std::string (*variant_forms)() = nullptr;
};

// Every mode, sorted by name.
const std::vector<Mode>& registry();
// The mode called `name`, or null.
const Mode* findMode(std::string_view name);
// The names for a message: "consensus, ping, ps or single".
std::string modeNames();
// The names of the modes that train the sparse models, for a message ("ps").
std::string sparseModeNames();
// The mode a training run named `named` runs on a topology of `nodes` nodes: the `alone` mode
// for one node when it trains the model's family (sparse or not), otherwise `named`.
const Mode& modeThatRuns(const Mode& named, size_t nodes, bool sparse_model);
// The names `--mode` takes, sorted, and the same for a message ("consensus, ping or ps").
std::vector<std::string> flagModes();
std::string flagModeNames();
// Every mode's variant forms, for compare's --help and errors: "consensus:RULE (...), ps:bsp,
// ..., single".
std::string variantForms();

// Why the registry is inconsistent (two modes with one name or one service id, a service id
// of 0, two `alone` modes, a mode that trains nothing and builds no session), or "" when it
// is not.
std::string registryProblems(const std::vector<Mode>& modes);

}  // namespace chorus::modes
