// `arbiter quantize` against llama-quantize, file against file (issue 26): the same f32 GGUF
// (synth's tiny-256, whose rows of 256 and 32 take every branch of the recipes: k-quant
// blocks, the output rule on a tied token_embd, use_more_bits, the fallbacks) quantized by
// both; every tensor must have llama-quantize's type and byte-identical blocks, except where
// docs/quantization.md documents a difference, which the test asserts as documented.
// The reference files are llama-quantize's outputs (tests/fixtures/quant/README.md has the
// commands). Add a type: its llama-quantize output in the fixture folder and a Case below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "test_util.h"

using namespace arbiter;

namespace {

// The input both tools read: synth's preset in f32 at seed 0, as the fixtures were made.
std::string synth_input(const std::string& root, const std::string& preset, int layers) {
  SynthOptions f;
  f.preset = preset;
  f.layers = layers;
  f.format = SynthFormat::Gguf;
  f.dtype = DType::F32;
  f.seed = 0;
  f.out_dir = root + "/" + preset + "-f32.gguf";
  f.progress = false;
  synth_checkpoint(f);
  return f.out_dir;
}

// arbiter's type for a tensor where the recipe differs from llama-quantize's by design
// (docs/quantization.md); nullopt where it must be llama-quantize's type and bytes.
using Differs = std::optional<DType> (*)(const Tensor& want);

// Quantizes `in` with r and compares the result with llama-quantize's output `file`:
// metadata, tensor order and every tensor (returns how many tensors llama-quantize
// quantized).
int compare_with_llama_quantize(const std::string& in_path, const std::string& out, QuantRecipe r,
                                const char* file, Differs differs) {
  quantize_gguf(in_path, out, r, 2);
  GgufFile got(out), want(test::source_path(std::string("tests/fixtures/quant/llama-quantize/") + file));
  // Metadata: every key and value llama-quantize wrote (general.file_type and
  // quantization_version included), except general.alignment, which llama-quantize copies
  // from the input and arbiter leaves out: 32 either way, the GGUF default.
  for (const auto& [key, w] : want.metadata()) {
    SCOPED_TRACE(key);
    if (key == "general.alignment") {
      EXPECT_EQ(w.u, 32u);
      EXPECT_FALSE(got.has(key));
      EXPECT_EQ(got.alignment(), want.alignment());
      continue;
    }
    const GgufValue* g = got.find(key);
    if (!g) {
      ADD_FAILURE() << "missing";
      continue;
    }
    EXPECT_EQ(g->type, w.type);
    EXPECT_TRUE(g->u == w.u && g->i == w.i && g->f == w.f && g->b == w.b && g->s == w.s && g->au == w.au &&
                g->ai == w.ai && g->af == w.af && g->as == w.as);
  }
  EXPECT_EQ(got.metadata().size() + 1, want.metadata().size());
  // Tensor order: arbiter keeps the input's; llama-quantize writes its loader's map order
  // (llama-model-loader.h weight_name_comparer: by block number, tensors outside the blocks
  // first, then by name).
  const GgufFile in(in_path);
  std::vector<std::string> input_order, got_order, want_order;
  for (const Tensor& t : in.tensors()) input_order.push_back(t.name);
  for (const Tensor& t : got.tensors()) got_order.push_back(t.name);
  for (const Tensor& t : want.tensors()) want_order.push_back(t.name);
  std::vector<std::string> loader_order = input_order;
  auto block = [](const std::string& n) {
    int l = -1;
    std::sscanf(n.c_str(), "blk.%d.", &l);
    return l;
  };
  std::sort(loader_order.begin(), loader_order.end(), [&](const std::string& a, const std::string& b) {
    return block(a) != block(b) ? block(a) < block(b) : a < b;
  });
  EXPECT_EQ(got_order, input_order);
  EXPECT_EQ(want_order, loader_order);
  EXPECT_NE(input_order, loader_order);  // so the two orders are told apart
  int quantized = 0;
  for (const Tensor& w : want.tensors()) {
    SCOPED_TRACE(w.name);
    const Tensor* g = got.tensor(w.name);
    if (!g) {
      ADD_FAILURE() << "missing";
      continue;
    }
    EXPECT_EQ(g->shape, w.shape);
    quantized += w.dtype != DType::F32;
    if (const std::optional<DType> d = differs(w)) {
      EXPECT_EQ(dtype_name(g->dtype), std::string(dtype_name(*d))) << "the documented difference";
      continue;
    }
    EXPECT_EQ(dtype_name(g->dtype), std::string(dtype_name(w.dtype)));
    if (g->nbytes() != w.nbytes()) {
      ADD_FAILURE() << "sizes differ";
      continue;
    }
    EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes()), 0) << "blocks differ";
  }
  return quantized;
}

std::optional<DType> no_difference(const Tensor&) { return std::nullopt; }

TEST(LlamaQuantize, SameTypesAndBlocksAsLlamaQuantize) {
  const std::string root = test::temp_dir("llama-quantize");
  const std::string in = synth_input(root, "tiny-256", 0);
  const std::pair<QuantRecipe, const char*> cases[] = {
      {QuantRecipe::Q8_0, "tiny-256-Q8_0.gguf"},     {QuantRecipe::Q4_0, "tiny-256-Q4_0.gguf"},
      {QuantRecipe::Q6_K, "tiny-256-Q6_K.gguf"},     {QuantRecipe::Q4_K_M, "tiny-256-Q4_K_M.gguf"},
      {QuantRecipe::Q5_K_M, "tiny-256-Q5_K_M.gguf"},
  };
  for (const auto& [r, file] : cases) {
    SCOPED_TRACE(quant_recipe_name(r));
    const int quantized =
        compare_with_llama_quantize(in, root + "/" + quant_recipe_name(r) + ".gguf", r, file, no_difference);
    EXPECT_EQ(quantized, 8);  // token_embd and the seven matrices of the layer
  }
}

// MXFP4: llama.cpp's MXFP4_MOE puts the expert stacks in MXFP4 and every other matrix in Q8_0
// (the output too); arbiter's MXFP4 puts every matrix but the output in MXFP4, so that a
// dense model gets MXFP4 at all (docs/quantization.md). The experts, the output and the
// 1-D tensors are byte-identical; the other matrices differ by that rule.
TEST(LlamaQuantize, Mxfp4ExpertsAsLlamaQuantizesThem) {
  const std::string root = test::temp_dir("llama-quantize-mxfp4");
  const std::string in = synth_input(root, "tiny-moe", 1);
  auto differs = [](const Tensor& w) -> std::optional<DType> {
    const bool experts = w.name.find("_exps.") != std::string::npos;
    if (w.shape.size() < 2 || experts || w.name == "output.weight" || w.name.find("ffn_gate_inp") != std::string::npos)
      return std::nullopt;
    EXPECT_EQ(w.dtype, DType::Q8_0);  // llama-quantize's side of the difference
    return DType::MXFP4;
  };
  const int quantized = compare_with_llama_quantize(in, root + "/MXFP4.gguf", QuantRecipe::MXFP4,
                                                    "tiny-moe-1-MXFP4_MOE.gguf", differs);
  EXPECT_EQ(quantized, 9);  // output, token_embd, attn q/k/v/output, three expert stacks
}

}  // namespace
