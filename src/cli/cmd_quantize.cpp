// arbiter quantize: a GGUF file re-encoded in ggml's block formats with llama.cpp's mixture
// recipes (src/model/quantize.h, docs/quantization.md).
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "model/quantize.h"

namespace arbiter::cli {

static int cmd_quantize(int argc, char** argv) {
  Args a("quantize", {"--type", "-o|--out", "-t|--threads"}, {"-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter quantize IN.gguf -o OUT.gguf --type Q8_0|Q4_0|Q6_K|Q4_K_M|Q5_K_M|MXFP4 [-t THREADS]\n"
                 "Re-encodes every matrix of an f32/f16/bf16 GGUF in ggml's block formats, choosing each\n"
                 "tensor's type as llama-quantize does without an imatrix (the output matrix Q6_K, some\n"
                 "attn_v and ffn_down layers Q6_K under the _M mixtures; docs/quantization.md), with\n"
                 "llama.cpp's reference encoders. 1-D tensors are written F32. OUT is written atomically.\n");
    return 0;
  }
  ARB_CHECK(a.positional().size() == 1, "[cli] quantize: expected one input GGUF (got %zu arguments)",
            a.positional().size());
  const std::string in = a.positional()[0];
  const std::string out = a.str("out");
  const QuantRecipe r = quant_recipe_from_name(a.str("type"));
  const QuantizeStats s = quantize_gguf(in, out, r, thread_count(a));
  std::fprintf(stderr, "[quantize] wrote %s: %s, %d tensors (%d quantized), %.3f MB -> %.3f MB\n", out.c_str(),
               quant_recipe_name(r), s.tensors, s.quantized, s.bytes_in / 1e6, s.bytes_out / 1e6);
  std::printf("%s\n", out.c_str());
  return 0;
}

REGISTER_COMMAND("quantize", "re-encode a GGUF in ggml's block formats (Q4_K_M, Q8_0, ...) as llama-quantize does",
                 cmd_quantize);

}  // namespace arbiter::cli
