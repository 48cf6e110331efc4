// arbiter quantize: a GGUF file re-encoded in ggml's block formats with llama.cpp's mixture
// recipes (src/model/quantize.h, docs/quantization.md).
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "model/quantize.h"

namespace arbiter::cli {

static int cmd_quantize(int argc, char** argv) {
  Args a("quantize", {"--type", "--mlx", "--group-size", "-o|--out", "-t|--threads"}, {"-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter quantize IN.gguf -o OUT.gguf --type Q8_0|Q4_0|Q6_K|Q4_K_M|Q5_K_M|MXFP4 [-t THREADS]\n"
                 "       arbiter quantize IN_DIR -o OUT_DIR --mlx 2|3|4|5|6|8 [--group-size 32|64|128] [-t THREADS]\n"
                 "--type re-encodes every matrix of an f32/f16/bf16 GGUF in ggml's block formats, choosing each\n"
                 "tensor's type as llama-quantize does without an imatrix (the output matrix Q6_K, some\n"
                 "attn_v and ffn_down layers Q6_K under the _M mixtures; docs/quantization.md), with\n"
                 "llama.cpp's reference encoders. 1-D tensors are written F32. OUT is written atomically.\n"
                 "--mlx writes an HF directory in MLX's affine layout as mlx-lm's convert does (every 2-D\n"
                 "weight whose rows divide into the group size, default 64; config.json's `quantization`\n"
                 "block), the model's other files copied. OUT_DIR must not exist; it appears whole or not at all.\n");
    return 0;
  }
  ARB_CHECK(a.positional().size() == 1, "[cli] quantize: expected one input (got %zu arguments)",
            a.positional().size());
  const std::string in = a.positional()[0];
  const std::string out = a.str("out");
  if (a.has("mlx")) {
    ARB_CHECK(!a.has("type"), "[cli] quantize: --mlx and --type exclude each other");
    const int bits = a.int_in("mlx", 0, 64);
    const int group = a.int_in("group-size", 64, 0, 1 << 20);  // quantize_mlx names the valid values
    const QuantizeStats s = quantize_mlx(in, out, bits, group, thread_count(a));
    std::fprintf(stderr, "[quantize] wrote %s: MLX affine %d-bit, group size %d, %d tensors (%d quantized), %.3f MB -> %.3f MB\n",
                 out.c_str(), bits, group, s.tensors, s.quantized, s.bytes_in / 1e6, s.bytes_out / 1e6);
    std::printf("%s\n", out.c_str());
    return 0;
  }
  ARB_CHECK(!a.has("group-size"), "[cli] quantize: --group-size goes with --mlx");
  const QuantRecipe r = quant_recipe_from_name(a.str("type"));
  const QuantizeStats s = quantize_gguf(in, out, r, thread_count(a));
  std::fprintf(stderr, "[quantize] wrote %s: %s, %d tensors (%d quantized), %.3f MB -> %.3f MB\n", out.c_str(),
               quant_recipe_name(r), s.tensors, s.quantized, s.bytes_in / 1e6, s.bytes_out / 1e6);
  std::printf("%s\n", out.c_str());
  return 0;
}

REGISTER_COMMAND("quantize", "re-encode a GGUF in ggml's block formats (Q4_K_M, Q8_0, ...) as llama-quantize does, or an HF directory in MLX's layout",
                 cmd_quantize);

}  // namespace arbiter::cli
