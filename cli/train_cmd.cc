// `chorus train`: one node training alone, the baseline every distributed run is measured
// against. The image models run the training loop with no peers (run/single_node.h), the same
// run as the single variant of `chorus compare`, with the training options of `chorus node`;
// the sparse models (matrix factorization, knowledge-graph embeddings) run in cli/train_sparse.
// This file only maps flags to options.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/train_sparse.h"
#include "faults/straggler.h"
#include "ml/dataset.h"
#include "ml/train.h"
#include "run/single_node.h"
#include "run/training_run.h"

namespace chorus::cli {

namespace {

struct TrainFlags {
  run::RunOptions run;
  int64_t log_every = 100;  // the sparse models' "step" events
  SparseFlags sparse;
  CLI::Option* data = nullptr;  // --data, to tell whether it was given
};

// Training options of the image models that the sparse models do not take (the sparse code
// refuses the other image-only flags itself).
const std::vector<std::string> kImageOnlyFlags = {"--rounds", "--stragglers", "--target-acc"};

void runSparseTrain(const CLI::App& app, TrainFlags& flags) {
  const run::RunOptions& run = flags.run;
  for (const std::string& flag : kImageOnlyFlags) {
    if (app.count(flag) > 0) {
      throw CommandFailure(
          2, fmt::format("{} does not apply to --model {} (the image models' flag); see chorus "
                         "train --help",
                         flag, run.model.name));
    }
  }
  if (app.count("--epochs") > 0 && run.epochs != std::floor(run.epochs)) {
    throw CommandFailure(
        2, fmt::format("--epochs {}: --model {} trains whole epochs", run.epochs, run.model.name));
  }
  ml::TrainOptions options;
  options.data = run.data;
  options.model = run.model;
  options.epochs = std::llround(run.epochs);
  options.batchSize = run.batch;
  options.learningRate = run.lr;
  options.seed = run.seed;
  node::Result<std::string> metrics_path = run::nodeMetricsPath(run.out_dir, 0);
  if (!metrics_path.ok()) throw CommandFailure(2, metrics_path.message());
  options.metricsPath = std::move(metrics_path).value();
  options.savePath = run.save_path;
  options.resumePath = run.resume_path;
  options.logEverySteps = flags.log_every;
  if (isKgeModel(run.model.name)) return runKgeTrain(app, options, flags.sparse);
  return runMfTrain(app, options, flags.sparse);
}

void runTrain(const CLI::App& app, TrainFlags& flags) {
  const std::string& model = flags.run.model.name;
  if (model == "mf" || isKgeModel(model)) {
    if (flags.data->count() == 0) flags.run.data.name = model == "mf" ? "zipf-mf" : "wn18rr";
    // --eval-every counts steps; the KGE models' epochs are --eval-every-epochs. The old
    // spelling still means epochs for them, for one release.
    if (isKgeModel(model) && app.count("--eval-every") > 0) {
      if (app.count("--eval-every-epochs") > 0) {
        throw CommandFailure(2, "--eval-every counts steps: for --model " + model +
                                    " give --eval-every-epochs alone");
      }
      std::fprintf(stderr,
                   "chorus: warning: --eval-every for the knowledge-graph models is deprecated "
                   "and goes in the next release: write --eval-every-epochs %lld (--eval-every "
                   "counts steps)\n",
                   static_cast<long long>(flags.run.eval_every));
      flags.sparse.evalEvery = flags.run.eval_every;
    }
    return runSparseTrain(app, flags);
  }
  const std::pair<const std::vector<std::string>*, const char*> families[] = {
      {&kMfOnlyFlags, "--model mf only"},
      {&kKgeOnlyFlags, "the knowledge-graph models only (--model complex or distmult)"},
      {&kSparseFlags, "the sparse models only (--model mf, complex or distmult)"}};
  for (const auto& [flags_of, whom] : families) {
    for (const std::string& flag : *flags_of) {
      if (app.count(flag) > 0) throw CommandFailure(2, fmt::format("{} applies to {}", flag, whom));
    }
  }
  if (app.count("--log-every") > 0) {
    throw CommandFailure(2,
                         "--log-every applies to the sparse models only (--model mf, complex or "
                         "distmult): the image models write an event every step");
  }
  const std::string& data = flags.run.data.name;
  if (data == "zipf-mf" || data == "ratings") {
    throw CommandFailure(2, fmt::format("--data {} needs --model mf", data));
  }
  const auto& imageSets = ml::datasetNames();
  if (std::find(imageSets.begin(), imageSets.end(), data) == imageSets.end()) {
    throw CommandFailure(2, fmt::format("--data {}: --model {} takes {}; knowledge graphs are for "
                                        "--model complex or distmult",
                                        data, model, fmt::join(imageSets, ", ")));
  }
  run::RunOptions options = flags.run;
  const bool eval_given = app.count("--eval-every") > 0;
  // One node: a straggler term for another node would never act.
  for (const uint32_t named : options.stragglers.namedNodes()) {
    if (named != 0) {
      throw CommandFailure(2, fmt::format("--stragglers {}: names node {}, but chorus train runs "
                                          "node 0 alone",
                                          options.stragglers.text, named));
    }
  }
  if (const node::Status checked = run::checkRunOptions(options); !checked.ok()) {
    throw CommandFailure(2, checked.message());
  }
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  // The per-epoch lines say what the loop's info lines would; warnings still show.
  auto log =
      std::make_shared<spdlog::logger>("train", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log->set_pattern("chorus: %l: %v");
  log->set_level(spdlog::level::warn);
  run::SingleReport report;
  runTraining(progress, [&] {
    // Bad settings: exit 2; a data file or --resume checkpoint that cannot be used: 1.
    node::Result<ml::DataSplit> split = run::loadRunSplit(options);
    if (!split.ok()) throw CommandFailure(exitStatusOf(split.status()), split.message());
    progress.line(fmt::format("data: {} from {} ({} training, {} test samples, {})",
                              options.data.name, split->source, split->train.size(),
                              split->test.size(), split->train.shape.toString()));
    node::Result<run::NodeJob> prepared =
        run::prepareNodeProcessJob(options, std::move(split).value(), 0, 1);
    if (!prepared.ok()) throw CommandFailure(exitStatusOf(prepared.status()), prepared.message());
    run::NodeJob& job = *prepared;
    run::SingleOptions single;
    single.eval_every_epoch = !eval_given;
    single.save_path = options.save_path;
    single.warmup_epochs = options.warmup_epochs;
    report = run::trainAlone(job, single, progress, *log);
  });
  const run::LoopReport& loop = report;
  std::printf("model: %s (%zu parameters)\n", report.model_spec.c_str(), report.parameters);
  std::printf("epochs: %g, steps: %lld, training time: %.1f s, %.0f samples/s\n",
              report.epochs_done, static_cast<long long>(loop.steps_done), loop.seconds,
              report.samples_per_second);
  std::printf("test: loss %.4f, accuracy %.2f%% (%zu samples)\n", loop.final.loss,
              100.0 * loop.final.accuracy, loop.final.samples);
  if (options.target_acc > 0) {
    if (loop.time_to_target) {
      std::printf("reached test accuracy %.2f%% after %.1f s\n", 100 * options.target_acc,
                  *loop.time_to_target);
    } else {
      std::printf("did not reach test accuracy %.2f%%\n", 100 * options.target_acc);
    }
  }
  if (options.confusion) std::printf("%s", ml::formatConfusion(loop.final).c_str());
  if (!options.save_path.empty()) std::printf("saved the model to %s\n", options.save_path.c_str());
  std::fflush(stdout);
}

}  // namespace

void addTrainCommand(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  run::RunOptions& o = flags->run;
  o.data.name = "fashion-mnist";
  o.model.name = "mlp";
  CLI::App* train = app.add_subcommand(
      "train",
      "Train one model on one node (no networking): the baseline for distributed runs.\n"
      "The image models run the loop every node runs, with no peers: the single variant of\n"
      "chorus compare is this run. It takes the training options of chorus node and launch\n"
      "(--shard aside: one node holds the whole training set). Prints a progress line (live on\n"
      "a terminal), a line per epoch and a summary; metrics in --out DIR/node-0.jsonl (the\n"
      "format chorus report reads); --save writes a checkpoint after every epoch, --resume\n"
      "continues it.\n"
      "Example: chorus train --data fashion-mnist --model mlp --epochs 5 --batch 64 --lr 0.05\n"
      "Matrix factorization on Zipf-skewed ratings: chorus train --model mf --data zipf-mf\n"
      "Knowledge graphs: chorus train --data wn18rr --model complex --dim 200 --negatives 512\n"
      "  --loss ce --reg n3 --reg-weight 0.01 (filtered MRR and Hits@k on valid and test)");
  run::addRunOptions(*train, o);
  // One node trains on the whole training set: there is nothing to split.
  train->remove_option(train->get_option("--shard"));
  // The sparse models take more data sets and models than the image ones.
  flags->data = train->get_option("--data");
  flags->data->get_validator()->active(false);
  flags->data->description(
      "Data set: mnist, fashion-mnist, cifar10, synthetic (image models); zipf-mf (generated) "
      "or ratings (--data-file) for --model mf, its default zipf-mf; wn18rr or the name of any "
      "triple folder given with --data-dir for the knowledge-graph models, their default wn18rr");
  std::vector<std::string> models = ml::modelNames();
  models.push_back("mf");
  models.insert(models.end(), ml::kgeModelNames().begin(), ml::kgeModelNames().end());
  CLI::Option* model = train->get_option("--model");
  model->get_validator()->active(false);
  model->check(CLI::IsMember(models))
      ->description(
          "Model: softmax, mlp, lenet, cifar-cnn (images); mf (matrix factorization); complex, "
          "distmult (knowledge-graph embeddings)");
  train->get_option("--data-dir")
      ->description(
          "Folder holding the data files (or their usual sub-folder mnist/, fashion-mnist/, "
          "cifar-10-batches-bin/, <--data>/ for triples). Default: $CHORUS_DATA, then data/ in "
          "the source tree, then /usr/share/datasets/. A triple folder holds train.txt, "
          "valid.txt, test.txt (head<TAB>relation<TAB>tail, plain or .gz), optionally "
          "entities.dict, relations.dict");
  train->get_option("--epochs")
      ->description(
          "Passes over the training set when --rounds is 0 (image models: fractions allowed; "
          "mf: default 10)");
  train->get_option("--rounds")
      ->description("Training steps (image models; 0: derived from --epochs)");
  train->get_option("--batch")->description(
      "Minibatch size (mf: default 1000 ratings; knowledge graphs: 512 triples)");
  train->get_option("--lr")->description("Base learning rate (sparse models: default 0.1)");
  train->get_option("--out")->description(
      "Write metrics as JSON lines to DIR/node-0.jsonl (the format of chorus node and compare)");
  train->get_option("--save")->description(
      "Write a checkpoint to this file after every epoch and at the end (atomic replace)");
  train->get_option("--stragglers")
      ->description(
          "Straggler profile of the one node, node 0 (docs/stragglers.md), e.g. "
          "shifted-exp:5,20 or slow:0=4; crash:0@S ends the process after step S");
  train
      ->add_option("--log-every", flags->log_every,
                   "Sparse models: a 'step' metrics event every N steps (the image models "
                   "write one every step)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000'000}))
      ->capture_default_str();
  addSparseOptions(*train, flags->sparse);
  train->get_option("--eval-every")
      ->description(
          "Image models: test accuracy every N steps (default: at the end of every epoch; 0: "
          "only at the end). The KGE models count epochs: --eval-every-epochs")
      ->default_str("");
  train->callback([flags, train] { runTrain(*train, *flags); });
}

}  // namespace chorus::cli
