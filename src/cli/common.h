// Options shared by the subcommands that run a model: -m, --device, --dtype, -t, --inject,
// --mix, --stats. Keeps every subcommand's spelling of them identical.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/command.h"
#include "engine/inject.h"
#include "model/model.h"

namespace arbiter::cli {

/// -t/--threads: 0 (the default) uses every hardware thread; more than the hardware has is
/// capped there, with a note on stderr (more threads only contend, and a count like 100000
/// would exhaust the process's threads).
int thread_count(const Args& a);

/// --route-decided (compare, store compare, drift): the reference router's margin at which a
/// routing flip is decided (verify/judge/route_flips.h); a number >= 0, kRouteDecided if absent.
double route_decided_option(const Args& a, const std::string& command);
/// Its help line, the same in every command's usage.
std::string route_decided_help();

/// Option specs to pass to Args for the shared options.
std::vector<std::string> model_value_opts();
std::vector<std::string> model_flag_opts();

struct ModelRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  InjectSpec inject;
  bool stats = false;  // --stats or ARBITER_OP_STATS=1
};

/// Loads -m (or takes `model`, one built in memory) and makes the --device/--dtype/-t
/// backend; parses --inject.
ModelRun open_model_run(const Args& a, std::unique_ptr<Model> model = nullptr);
/// --ctx (a session's positions): dflt when absent; refused when below lo or past the
/// model's maximum (max_position_embeddings / context_length), naming that limit:
///   "[cli] generate: --ctx 2048 passes the model's maximum of 512 positions (...)".
/// A model that states no maximum (max_pos <= 0) is bounded at INT32_MAX.
int context_option(const Args& a, const std::string& command, int64_t dflt, int64_t lo, const Model& m);
/// Prints the op-stats table to stderr when asked.
void print_stats_if_asked(const ModelRun& r);
/// "ARBITER_X=v ..." for the ARBITER_* variables set, or "none".
std::string arbiter_env();

}  // namespace arbiter::cli
