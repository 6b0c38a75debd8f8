// Variant names and their mapping to node options.
#include "experiment/variant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "modes/registry.h"
#include "ps/sparse_row_access.h"
#include "topology/topology.h"

namespace chorus::experiment {
namespace {

using Args = std::vector<std::string>;

TEST(Variant, PsVariantsMapToModeAndStaleness) {
  EXPECT_EQ(Variant::read("ps:bsp").value().modeArgs(), (Args{"--mode", "ps", "--staleness", "0"}));
  EXPECT_EQ(Variant::read("ps:ssp:3").value().modeArgs(),
            (Args{"--mode", "ps", "--staleness", "3"}));
  EXPECT_EQ(Variant::read("ps:ssp:0").value().modeArgs(),
            (Args{"--mode", "ps", "--staleness", "0"}));
  EXPECT_EQ(Variant::read("ps:async").value().modeArgs(),
            (Args{"--mode", "ps", "--staleness", "inf"}));
  EXPECT_EQ(Variant::read("ps:async").value().mode, "ps");
}

TEST(Variant, ConsensusVariantsMapToBackupRule) {
  EXPECT_EQ(Variant::read("consensus:wait-all").value().modeArgs(),
            (Args{"--mode", "consensus", "--backup", "wait-all"}));
  EXPECT_EQ(Variant::read("consensus:static:1").value().modeArgs(),
            (Args{"--mode", "consensus", "--backup", "static:1"}));
  EXPECT_EQ(Variant::read("consensus:dynamic").value().setting("--backup"), "dynamic");
  EXPECT_EQ(Variant::read("consensus:deadline:0.75").value().dirName(), "consensus-deadline-0.75");
}

TEST(Variant, SingleHasNoModeArguments) {
  Variant v = Variant::read("single").value();
  EXPECT_EQ(v.mode, "single");
  EXPECT_TRUE(v.alone());
  EXPECT_TRUE(v.modeArgs().empty());
  EXPECT_EQ(v.dirName(), "single");
}

TEST(Variant, UnknownVariantsAreRefusedWithTheAcceptedForms) {
  for (const char* bad :
       {"", "ps", "ps:", "ps:ssp:", "ps:ssp:x", "ps:ssp:-1", "ps:ssp:2x", "ps:bulk",
        "consensus:", "consensus:bogus", "consensus:static:-1", "singles", "allreduce"}) {
    const node::Result<Variant> read = Variant::read(bad);
    ASSERT_FALSE(read.ok()) << "accepted '" << bad << "'";
    const std::string& what = read.message();
    EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(Variant, ListParsesInOrderAndRefusesDuplicatesAndEmptyEntries) {
  auto list = readVariantList("single, ps:bsp,consensus:dynamic").value();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].name, "single");
  EXPECT_EQ(list[1].name, "ps:bsp");
  EXPECT_EQ(list[2].name, "consensus:dynamic");
  EXPECT_NE(readVariantList("single,single").message().find("named twice"), std::string::npos);
  EXPECT_NE(readVariantList("single,,ps:bsp").message().find("empty entry"), std::string::npos);
  EXPECT_FALSE(readVariantList("").ok());
  EXPECT_NE(readVariantList("single,nope").message().find("'nope'"), std::string::npos);
}

TEST(Variant, NodeArgsForwardOptionsAndSetSeedOutAndBudget) {
  const std::vector<ForwardedOption> forwarded = {{"--data", {"synthetic"}},
                                                  {"--stragglers", {"shifted-exp:5,20+slow:1=2"}}};
  RunBudget budget{100, 10, 4};
  EXPECT_EQ(
      nodeArgs(Variant::read("ps:ssp:2").value(), forwarded, budget, 7, "out/ps-ssp-2/seed-7"),
      (Args{"--mode", "ps", "--staleness", "2", "--data", "synthetic", "--stragglers",
            "shifted-exp:5,20+slow:1=2", "--rounds", "100", "--eval-every", "10", "--seed", "7",
            "--out", "out/ps-ssp-2/seed-7"}));
}

TEST(Variant, SingleDoesTheWholeClustersRoundsAndEvaluatesAfterAsManySamples) {
  RunBudget budget{100, 10, 4};
  EXPECT_EQ(nodeArgs(Variant::read("single").value(), {}, budget, 1, "o"),
            (Args{"--rounds", "400", "--eval-every", "40", "--seed", "1", "--out", "o"}));
  // With --epochs (rounds 0) the epochs are forwarded as given: the same passes over the data.
  budget.rounds = 0;
  EXPECT_EQ(nodeArgs(Variant::read("single").value(), {{"--epochs", {"2"}}}, budget, 1, "o"),
            (Args{"--epochs", "2", "--eval-every", "40", "--seed", "1", "--out", "o"}));
}

TEST(Variant, NodeArgsRefuseForwardingPerRunFlags) {
  EXPECT_THROW(nodeArgs(Variant::read("single").value(), {{"--seed", {"3"}}}, RunBudget{}, 1, "o"),
               std::logic_error);
  EXPECT_THROW(nodeArgs(Variant::read("consensus:dynamic").value(), {{"--rejoin", {}, "consensus"}},
                        RunBudget{}, 1, "o"),
               std::logic_error);
}

TEST(Variant, ModeOptionsReachOnlyTheirModesVariants) {
  const std::vector<ForwardedOption> forwarded = {{"--lr", {"0.1"}, ""},
                                                  {"--owner-momentum", {"push"}, "ps"},
                                                  {"--no-cache", {}, "ps"},
                                                  {"--skip-gap", {"2"}, "consensus"}};
  const RunBudget budget{10, 5, 2};
  EXPECT_EQ(
      nodeArgs(Variant::read("ps:bsp").value(), forwarded, budget, 1, "o"),
      (Args{"--mode", "ps", "--staleness", "0", "--lr", "0.1", "--owner-momentum", "push",
            "--no-cache", "--rounds", "10", "--eval-every", "5", "--seed", "1", "--out", "o"}));
  EXPECT_EQ(nodeArgs(Variant::read("consensus:wait-all").value(), forwarded, budget, 1, "o"),
            (Args{"--mode", "consensus", "--backup", "wait-all", "--lr", "0.1", "--skip-gap", "2",
                  "--rounds", "10", "--eval-every", "5", "--seed", "1", "--out", "o"}));
  // The single variant runs as a one-node cluster: neither mode's knobs apply to it.
  EXPECT_EQ(
      nodeArgs(Variant::read("single").value(), forwarded, budget, 1, "o"),
      (Args{"--lr", "0.1", "--rounds", "20", "--eval-every", "10", "--seed", "1", "--out", "o"}));
}

// --async-rounds means something to fully asynchronous PS only: a bounded PS node would log
// that it ignores it, and a consensus node would refuse it.
TEST(Variant, AsyncRoundsReachOnlyTheAsyncPsVariant) {
  const std::vector<ForwardedOption> forwarded = {
      {"--async-rounds", {"worker"}, std::string(modes::kPsAsyncScope)}};
  const RunBudget budget{10, 5, 2};
  const auto has = [](const Args& args) {
    return std::find(args.begin(), args.end(), "--async-rounds") != args.end();
  };
  EXPECT_TRUE(has(nodeArgs(Variant::read("ps:async").value(), forwarded, budget, 1, "o")));
  for (const char* name : {"ps:bsp", "ps:ssp:3", "consensus:wait-all", "single"}) {
    EXPECT_FALSE(has(nodeArgs(Variant::read(name).value(), forwarded, budget, 1, "o"))) << name;
  }
}

// The grammar is the registry's: every entry with variants parses its own names, and the list of
// accepted forms is built from the entries.
TEST(Variant, EachRegistryEntryParsesItsOwnVariants) {
  int with_variants = 0;
  for (const modes::Mode& mode : modes::registry()) {
    if (mode.parse_variant == nullptr) {
      EXPECT_FALSE(Variant::read(std::string(mode.name) + ":x").ok());
      continue;
    }
    ++with_variants;
    EXPECT_NE(variantForms().find(mode.variant_forms()), std::string::npos) << mode.name;
  }
  EXPECT_EQ(with_variants, 3);  // consensus, ps, single: ping has none (it does not train)
  const node::Result<Variant> ping = Variant::read("ping");
  ASSERT_FALSE(ping.ok()) << "accepted ping";
  EXPECT_NE(ping.message().find("mode ping has no variants"), std::string::npos) << ping.message();
  EXPECT_EQ(modes::registryProblems(modes::registry()), "");
  // An entry with a grammar but no forms is an inconsistent registry.
  std::vector<modes::Mode> broken = modes::registry();
  broken.front().variant_forms = nullptr;
  EXPECT_NE(modes::registryProblems(broken), "");
}

// Sparse PS: ps:TECHNIQUE and ps:TECHNIQUE:BOUND set --technique (and the bound); the technique
// list is --technique's.
TEST(Variant, PsTechniquesMapToTechniqueAndOptionalBound) {
  EXPECT_EQ(Variant::read("ps:classic").value().modeArgs(),
            (Args{"--mode", "ps", "--technique", "classic"}));
  EXPECT_EQ(Variant::read("ps:lapse").value().modeArgs(),
            (Args{"--mode", "ps", "--technique", "lapse"}));
  EXPECT_EQ(Variant::read("ps:lapse:ssp:3").value().modeArgs(),
            (Args{"--mode", "ps", "--staleness", "3", "--technique", "lapse"}));
  EXPECT_EQ(Variant::read("ps:classic:bsp").value().modeArgs(),
            (Args{"--mode", "ps", "--staleness", "0", "--technique", "classic"}));
  const Variant async = Variant::read("ps:lapse:async").value();
  EXPECT_EQ(async.setting("--staleness"), "inf");
  EXPECT_TRUE(async.inScope(modes::kPsAsyncScope));
  EXPECT_EQ(async.spec.family, modes::ModelFamily::kSparse);
  EXPECT_EQ(Variant::read("ps:bsp").value().spec.family, modes::ModelFamily::kAny);
  EXPECT_EQ(Variant::read("ps:lapse:ssp:3").value().dirName(), "ps-lapse-ssp-3");
  for (const std::string& name : modes::psTechniqueNames()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(ps::parseSparseTechnique(name).has_value());
    EXPECT_EQ(Variant::read("ps:" + name).value().setting("--technique"), name);
  }
  for (const char* bad : {"ps:lapse:", "ps:lapse:ssp", "ps:lapse:ssp:x", "ps:lapse:3",
                          "ps:lapse:lapse", "ps:bsp:lapse", "ps:zipf"}) {
    EXPECT_FALSE(Variant::read(bad).ok()) << bad;
  }
}

// ps:rotation: Orion's schedule, for matrix factorization only, with no bound of its own.
TEST(Variant, PsRotationSetsTheMfScheduleAndTakesNoBound) {
  const Variant rotation = Variant::read("ps:rotation").value();
  EXPECT_EQ(rotation.modeArgs(), (Args{"--mode", "ps", "--mf-schedule", "rotation"}));
  EXPECT_EQ(rotation.spec.family, modes::ModelFamily::kMf);
  EXPECT_NE(rotation.spec.family_reason.find("--model mf"), std::string::npos);
  EXPECT_TRUE(rotation.inScope("ps"));
  EXPECT_EQ(rotation.dirName(), "ps-rotation");
  for (const char* bad : {"ps:rotation:ssp:1", "ps:rotation:bsp", "ps:rotation:"}) {
    const node::Result<Variant> read = Variant::read(bad);
    ASSERT_FALSE(read.ok()) << bad << " accepted";
    EXPECT_NE(read.status().message().find("ps:rotation takes no bound"), std::string::npos)
        << read.status().message();
  }
  EXPECT_NE(modes::psVariantForms().find("ps:rotation"), std::string::npos);
}

// What a sparse run's nodes get: no --rounds and no --eval-every (a sparse model counts epochs
// and evaluates every --eval-every-epochs, forwarded as given), the PS-only sampling flags only
// to the PS variants, the gossip flags only to the consensus ones.
TEST(Variant, SparseRunsGetEpochsAndTheirModesFlagsOnly) {
  const std::vector<ForwardedOption> forwarded = {{"--model", {"complex"}, ""},
                                                  {"--epochs", {"3"}, ""},
                                                  {"--eval-every-epochs", {"1"}, ""},
                                                  {"--sample-scheme", {"pool"}, "ps"},
                                                  {"--cold-every", {"4"}, "consensus"}};
  RunBudget budget{0, 20, 4, true};
  EXPECT_EQ(nodeArgs(Variant::read("ps:lapse:ssp:1").value(), forwarded, budget, 2, "o"),
            (Args{"--mode", "ps", "--staleness", "1", "--technique", "lapse", "--model", "complex",
                  "--epochs", "3", "--eval-every-epochs", "1", "--sample-scheme", "pool", "--seed",
                  "2", "--out", "o"}));
  EXPECT_EQ(
      nodeArgs(Variant::read("consensus:dynamic").value(), forwarded, budget, 2, "o"),
      (Args{"--mode", "consensus", "--backup", "dynamic", "--model", "complex", "--epochs", "3",
            "--eval-every-epochs", "1", "--cold-every", "4", "--seed", "2", "--out", "o"}));
  EXPECT_EQ(nodeArgs(Variant::read("single").value(), forwarded, budget, 2, "o"),
            (Args{"--model", "complex", "--epochs", "3", "--eval-every-epochs", "1", "--seed", "2",
                  "--out", "o"}));
  // A flag the variant sets is never forwarded over it.
  EXPECT_THROW(nodeArgs(Variant::read("ps:lapse").value(), {{"--technique", {"classic"}, "ps"}},
                        budget, 1, "o"),
               std::logic_error);
  EXPECT_THROW(
      nodeArgs(Variant::read("ps:bsp").value(), {{"--staleness", {"1"}, "ps"}}, budget, 1, "o"),
      std::logic_error);
}

TEST(Variant, SingleTopologyIsAValidOneNodeCluster) {
  const std::string text = singleTopology("demo-single", "127.0.0.1:7300", "fixed:5");
  const node::Result<topology::Topology> parsed = topology::parseTopology(text, "single.toml");
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  const topology::Topology& topo = *parsed;
  ASSERT_EQ(topo.nodes.size(), 1u);
  EXPECT_EQ(topo.name, "demo-single");
  EXPECT_EQ(topo.mode, topology::Mode::kConsensus);
  EXPECT_EQ(topo.nodes[0].address(), "127.0.0.1:7300");
  EXPECT_EQ(topo.nodes[0].stragglers.text, "fixed:5");
  EXPECT_TRUE(topo.nodes[0].neighbors.empty());
  const node::Result<topology::Topology> quoted =
      topology::parseTopology(singleTopology("x\"y", "[::1]:7000", ""), "s.toml");
  ASSERT_TRUE(quoted.ok()) << quoted.message();
  EXPECT_EQ(quoted->name, "x\"y");
}

TEST(Variant, ShellQuoteQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shellQuote({"chorus", "--stragglers", "shifted-exp:5,20+slow:1=2"}),
            "chorus --stragglers shifted-exp:5,20+slow:1=2");
  EXPECT_EQ(shellQuote({"a b", "it's", ""}), "'a b' 'it'\\''s' ''");
}

}  // namespace
}  // namespace chorus::experiment
