// arbiter synth: a complete HF checkpoint with a real model's shapes and seeded random
// weights, for speed measurements only (src/model/synth.h).
#include <cstdio>
#include <limits>

#include "cli/common.h"
#include "core/error.h"
#include "model/synth.h"

namespace arbiter::cli {

static int cmd_synth(int argc, char** argv) {
  Args a("synth", {"--preset", "--dtype", "--seed", "--layers", "--format", "-o|--out", "-t|--threads"},
         {"--force", "--list", "-q|--quiet", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help") || a.flag("list")) {
    std::fprintf(stderr,
                 "usage: arbiter synth --preset NAME --dtype bf16|f16|f32|RECIPE [--seed N] [--layers N] "
                 "[--format hf|gguf] -o DIR|FILE.gguf [--force] [-t THREADS] [--quiet]\n"
                 "Writes an HF checkpoint directory (or, with --format gguf or -o X.gguf, one GGUF file with\n"
                 "the same weights) with the preset's shapes and seeded random weights: for speed\n"
                 "measurements only, never for correctness. RECIPE (GGUF only): q8_0, q4_0, q6_k, q4_k_m,\n"
                 "q5_k_m or mxfp4, the f32 weights encoded as `arbiter quantize --type` does.\npresets:\n");
    for (const SynthPreset& p : synth_presets()) {
      const ModelConfig& c = p.config;
      std::fprintf(stderr, "  %-24s %-44s L %d, D %d, H %d/%d, Dh %d, F %d, V %d%s\n", p.name.c_str(),
                   p.hf_id.c_str(), c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim, c.d_ff, c.vocab,
                   c.tied_embeddings ? ", tied" : "");
    }
    return 0;
  }
  ARB_CHECK(a.positional().empty(), "[cli] synth: unexpected argument '%s'", a.positional()[0].c_str());
  SynthOptions o;
  o.preset = a.str("preset");
  const std::string dtype = a.str("dtype", "bf16");
  o.quant = find_quant_recipe(dtype);
  o.dtype = o.quant ? DType::F32 : dtype_from_name(dtype);  // a recipe encodes f32 values
  const int64_t seed = a.integer("seed", 0);
  ARB_CHECK(seed >= 0, "[cli] synth: --seed must be >= 0");
  o.seed = uint64_t(seed);
  o.layers = a.int_in("layers", 0, 1, std::numeric_limits<int32_t>::max());
  o.out_dir = a.str("out");
  const bool gguf_name = o.out_dir.size() > 5 && o.out_dir.compare(o.out_dir.size() - 5, 5, ".gguf") == 0;
  const std::string format = a.str("format", gguf_name ? "gguf" : "hf");
  ARB_CHECK(format == "hf" || format == "gguf", "[cli] synth: --format must be hf or gguf (got '%s')", format.c_str());
  o.format = format == "gguf" ? SynthFormat::Gguf : SynthFormat::Hf;
  o.force = a.flag("force");
  o.threads = thread_count(a);
  o.progress = !a.flag("quiet");
  SynthResult plan = synth_plan(o);  // validates preset, dtype and layers before any work
  if (plan.weight_bytes > 8'000'000'000ull)
    std::fprintf(stderr, "[synth] warning: this checkpoint is %.1f GB; writing it takes minutes and that much disk\n",
                 plan.weight_bytes / 1e9);
  SynthResult r = synth_checkpoint(o);
  std::fprintf(stderr, "[synth] wrote %s: %s shape, %lld params, %.3f GB of %s weights (random: speed only)\n",
               o.out_dir.c_str(), o.preset.c_str(), (long long)r.n_params, r.weight_bytes / 1e9,
               o.quant ? quant_recipe_name(*o.quant) : dtype_name(o.dtype));
  std::printf("%s\n", o.out_dir.c_str());
  return 0;
}

REGISTER_COMMAND("synth", "write a random-weight HF checkpoint of a real model's shape (speed only)", cmd_synth);

}  // namespace arbiter::cli
