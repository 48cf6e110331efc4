// Synthetic checkpoints (see synth.h). Layout of what is written:
//   config.json              the preset's HF config (+ an "arbiter_synth" provenance block)
//   model.safetensors        tensors in name order; matrices and biases N(0, 0.02), norms 1
//   tokenizer.json           byte-level BPE: 256 byte tokens, synthetic merges, specials
//   tokenizer_config.json    bos/eos names, add_bos_token
//   generation_config.json   bos/eos ids
//   README.md                what this is, and that it is for speed only
// or, with SynthFormat::Gguf, one GGUF file holding the same weights and tokenizer.
#include "model/synth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/gguf_write.h"
#include "io/safetensors_write.h"
#include "model/arch.h"
#include "model/model.h"

namespace arbiter {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------
// Tensors.

// The tensors a checkpoint of c holds: the family's list, less a tied lm_head.
std::vector<TensorSpec> tensor_list(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  for (TensorSpec& t : arch_of(c.arch).tensors(c))
    if (!(t.tie_to && c.tied_embeddings)) out.push_back(std::move(t));
  return out;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------
// Tokenizer: byte-level BPE with synthetic merges.

// The merge alphabet in a rough English-frequency order (space first), as raw bytes.
std::vector<uint8_t> merge_alphabet() {
  const std::string first = " etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,'-\"!?;:()\n";
  std::vector<uint8_t> a(first.begin(), first.end());
  for (int b = 33; b < 127; ++b)
    if (first.find(char(b)) == std::string::npos) a.push_back(uint8_t(b));
  return a;
}

// Merges (left, right) in rank order: first all pairs of alphabet characters, then a pair
// token followed by one character, each level walked by anti-diagonals (i + j) so that
// pairs of frequent characters come first. Left-deep merges make every result string
// distinct. Returns exactly n merges (throws if n is more than the scheme can make).
std::vector<std::pair<std::string, std::string>> synthetic_merges(int64_t n) {
  std::vector<uint8_t> A = merge_alphabet();
  std::vector<std::string> ch;
  for (uint8_t b : A) ch.push_back(byte_level_char(b));
  const int64_t na = int64_t(ch.size());
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> level1;
  auto walk = [&](int64_t rows, const std::function<std::string(int64_t)>& left) {
    for (int64_t s = 0; s <= rows + na - 2 && int64_t(out.size()) < n; ++s)
      for (int64_t i = std::max<int64_t>(0, s - na + 1); i <= std::min(s, rows - 1) && int64_t(out.size()) < n; ++i)
        out.emplace_back(left(i), ch[size_t(s - i)]);
  };
  walk(na, [&](int64_t i) { return ch[size_t(i)]; });
  for (const auto& m : out) level1.push_back(m.first + m.second);
  if (int64_t(out.size()) < n) walk(int64_t(level1.size()), [&](int64_t i) { return level1[size_t(i)]; });
  ARB_CHECK(int64_t(out.size()) == n, "[synth] vocabulary needs %lld merges, the synthetic scheme makes at most %zu",
            (long long)n, out.size());
  return out;
}

// The vocabulary in id order (256 byte tokens, one token per merge, then the specials) and
// the merges, shared by tokenizer.json and the GGUF tokenizer so both encode alike.
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
};

SynthVocab synth_vocab(const SynthPreset& p, const ModelConfig& c) {
  const int64_t V = c.vocab, n_special = int64_t(p.specials.size());
  const int64_t n_merges = V - 256 - n_special;
  ARB_CHECK(n_merges >= 0, "[synth] vocabulary %lld too small for 256 byte tokens + %lld specials", (long long)V,
            (long long)n_special);
  SynthVocab v;
  v.merges = synthetic_merges(n_merges);
  v.tokens.reserve(size_t(V));
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_level_char(uint8_t(b)));
  for (const auto& [l, r] : v.merges) v.tokens.push_back(l + r);
  for (const std::string& sp : p.specials) v.tokens.push_back(sp);
  return v;
}

std::string tokenizer_json(const SynthPreset& p, const ModelConfig& c) {
  using json = nlohmann::ordered_json;
  const int64_t V = c.vocab, n_special = int64_t(p.specials.size());
  const SynthVocab sv = synth_vocab(p, c);
  // The vocabulary is written by hand in id order: ordered_json's object is a vector with
  // linear lookup, far too slow for 150k keys, and json's std::map would sort by text.
  std::string vocab = "{";
  for (int64_t id = 0; id < V - n_special; ++id)
    vocab += (id ? ",\n  " : "\n  ") + json(sv.tokens[size_t(id)]).dump() + ": " + std::to_string(id);
  json merges = json::array();
  for (const auto& [l, r] : sv.merges) merges.push_back(l + " " + r);
  vocab += "\n }";
  json added = json::array();
  for (int64_t k = 0; k < n_special; ++k)
    added.push_back({{"id", V - n_special + k}, {"content", p.specials[size_t(k)]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  json t = json::object();
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  if (p.bos >= 0 && p.add_bos) {
    // How Llama 3's tokenizer.json adds BOS: a template with the special token first.
    const std::string& bos = p.specials[size_t(p.bos)];
    const int64_t bos_id = V - n_special + p.bos;
    json single = json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
    json pair = single;
    pair.push_back({{"SpecialToken", {{"id", bos}, {"type_id", 1}}}});
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    t["post_processor"] = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair},
                           {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
  } else {
    t["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  }
  t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", "@VOCAB@"}, {"merges", merges}};
  std::string text = t.dump(1) + "\n";
  const std::string mark = "\"@VOCAB@\"";
  text.replace(text.find(mark), mark.size(), vocab);
  return text;
}

// ---------------------------------------------------------------------------------------
// JSON side files.

const char* torch_dtype(DType t) {
  return t == DType::BF16 ? "bfloat16" : t == DType::F16 ? "float16" : "float32";
}

std::string config_json(const SynthPreset& p, const ModelConfig& c, const SynthOptions& o) {
  using json = nlohmann::json;  // sorted keys, as transformers writes them
  const int64_t n_special = int64_t(p.specials.size());
  auto special_id = [&](int k) { return int64_t(c.vocab) - n_special + k; };
  json j;
  j["architectures"] = {p.hf_class};
  j["model_type"] = c.arch;
  j["max_position_embeddings"] = c.max_pos;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["vocab_size"] = c.vocab;
  j["torch_dtype"] = torch_dtype(o.dtype);
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["bos_token_id"] = special_id(p.bos >= 0 ? p.bos : 0);
  j["eos_token_id"] = special_id(p.eos);
  arch_of(c.arch).hf_config_json(c, j);
  j["arbiter_synth"] = {{"preset", p.name},
                        {"shape_of", p.hf_id},
                        {"seed", o.seed},
                        {"layers_override", o.layers > 0},
                        {"note", "random weights: for speed measurements only, never for correctness"}};
  return j.dump(2) + "\n";
}

std::string tokenizer_config_json(const SynthPreset& p, const ModelConfig& c) {
  using json = nlohmann::json;
  const int64_t n_special = int64_t(p.specials.size());
  json j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["add_bos_token"] = p.add_bos;
  j["add_eos_token"] = false;
  j["bos_token"] = p.bos >= 0 ? json(p.specials[size_t(p.bos)]) : json(nullptr);
  j["eos_token"] = p.specials[size_t(p.eos)];
  j["pad_token"] = nullptr;
  j["model_max_length"] = c.max_pos;
  j["clean_up_tokenization_spaces"] = false;
  json dec = json::object();
  for (int64_t k = 0; k < n_special; ++k)
    dec[std::to_string(int64_t(c.vocab) - n_special + k)] = {
        {"content", p.specials[size_t(k)]}, {"lstrip", false}, {"normalized", false},
        {"rstrip", false},                  {"single_word", false}, {"special", true}};
  j["added_tokens_decoder"] = dec;
  return j.dump(2) + "\n";
}

std::string generation_config_json(const SynthPreset& p, const ModelConfig& c) {
  using json = nlohmann::json;
  const int64_t n_special = int64_t(p.specials.size());
  json j;
  if (p.bos >= 0) j["bos_token_id"] = int64_t(c.vocab) - n_special + p.bos;
  j["eos_token_id"] = int64_t(c.vocab) - n_special + p.eos;
  j["do_sample"] = false;
  return j.dump(2) + "\n";
}

std::string readme(const SynthPreset& p, const ModelConfig& c, const SynthOptions& o, const SynthResult& r) {
  std::string s;
  s += "# Synthetic checkpoint: " + p.name + " shape, RANDOM WEIGHTS\n\n";
  s += "Written by `arbiter synth --preset " + p.name + " --dtype " + dtype_name(o.dtype) + " --seed " +
       std::to_string(o.seed) + (o.layers > 0 ? " --layers " + std::to_string(o.layers) : "") + "`.\n\n";
  s += "**For speed measurements only, never for correctness.** The weights are seeded noise\n"
       "(N(0, 0.02) matrices and biases, norm weights 1) and the tokenizer is a synthetic\n"
       "byte-level BPE (256 byte tokens, generated merges, special tokens at the end of the\n"
       "vocabulary): the model computes nothing meaningful. Only the shapes are real.\n\n";
  s += "Shapes of " + p.hf_id + " (source: " + p.source + ")" +
       (o.layers > 0 ? ", with the layer count overridden" : "") + ":\n\n";
  s += strformat("| layers | hidden | heads | kv heads | head dim | intermediate | vocab | tied | params | weight bytes |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n"
                 "| %d | %d | %d | %d | %d | %d | %d | %s | %lld | %llu |\n",
                 c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim, c.d_ff, c.vocab,
                 c.tied_embeddings ? "yes" : "no", (long long)r.n_params, (unsigned long long)r.weight_bytes);
  return s;
}

using Fill = std::function<void(int64_t begin, int64_t n, void* dst)>;

// fill, run on pool and counting the bytes it produces into meter (fills run one after
// another, in write order). A range is cut into chunks of 16K elements (whole blocks of every
// block type; a writer's pieces start on block boundaries), each a valid fill call, claimed by
// the pool's threads: each value depends only on its index, so the split cannot change a byte.
// The meter moves every 16M elements, so a large tensor (an embedding of 1.2 GB) stays live.
Fill metered(Fill fill, DType dt, ThreadPool& pool, Progress& meter, int64_t& bytes) {
  return [fill = std::move(fill), dt, &pool, &meter, &bytes](int64_t begin, int64_t n, void* dst) {
    constexpr int64_t kChunk = int64_t(1) << 14, kSlice = int64_t(1) << 24;
    for (int64_t k = 0; k < n; k += kSlice) {
      const int64_t m = std::min(kSlice, n - k), chunks = (m + kChunk - 1) / kChunk;
      pool.parallel_for_dynamic(chunks, chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t at = k + c * kChunk;
          fill(begin + at, std::min(kChunk, k + m - at), static_cast<char*>(dst) + dtype_bytes(dt, at));
        }
      });
      bytes += int64_t(dtype_bytes(dt, m));
      meter.update(bytes);
    }
  };
}

// The bytes of elements [begin, begin + n) of one tensor in dtype dt: norms are ones (plus
// `offset`, a GGUF's 1 + w for gemma: TensorSpec::gguf_offset), everything else N(0, 0.02)
// from the stream keyed by the tensor's HF name and the seed. Row r of the written tensor is
// row src_row(r) of the HF tensor (rows of `cols` elements); no src_row means the same row.
// Each element depends only on (key, HF index), so threads and formats cannot change a value.
Fill seeded_fill(const std::string& hf_name, uint64_t seed, bool ones, DType dt, int64_t cols,
                 std::function<int64_t(int64_t)> src_row = nullptr, double offset = 0) {
  const uint64_t key = synth_stream_key(hf_name, seed);
  return [key, ones, dt, cols, src_row, offset](int64_t begin, int64_t n, void* dst) {
    thread_local std::vector<float> f;  // metered's chunks: reused, never a fresh allocation
    f.assign(size_t(n), float(1.0 + offset));
    if (!ones && !src_row) synth_normals(key, begin, n, 0.02, f.data());
    for (int64_t e = begin, end = begin + n; !ones && src_row && e < end;) {
      const int64_t row = e / cols, col = e % cols, len = std::min(end - e, cols - col);
      synth_normals(key, src_row(row) * cols + col, len, 0.02, f.data() + (e - begin));
      e += len;
    }
    encode_f32(dt, f.data(), n, dst);
  };
}

// llama.cpp's converter permutes Q/K rows per head from HF's half-split RoPE layout to
// adjacent pairs: written row h*Dh + 2j + i holds HF row h*Dh + i*Dh/2 + j (i in {0, 1}).
std::function<int64_t(int64_t)> rope_adjacent_rows(int64_t head_dim) {
  return [head_dim](int64_t r) {
    const int64_t h = r / head_dim, w = r % head_dim;
    return h * head_dim + (w % 2) * (head_dim / 2) + w / 2;
  };
}

// Spec s's seeded values: keyed by its HF name, or, stored only inside an HF stack (Granite's
// experts), by the stack's name at the slice's rows, so that the stack written whole holds
// the values a fill of the stack itself would.
Fill spec_fill(const TensorSpec& s, uint64_t seed, DType dt, std::function<int64_t(int64_t)> src_row = nullptr,
               double offset = 0) {
  const int64_t cols = s.shape.size() == 2 ? s.shape[1] : 1;
  const bool ones = s.kind == TensorKind::Norm;
  if (!s.hf.empty() || s.hf_stack.empty())
    return seeded_fill(s.hf, seed, ones, dt, cols, std::move(src_row), offset);
  const int64_t base = s.hf_stack.expert * s.hf_stack.rows + s.hf_stack.row0;
  return seeded_fill(s.hf_stack.name, seed, ones, dt, cols,
                     [base, src_row](int64_t r) { return base + (src_row ? src_row(r) : r); }, offset);
}

// The fills of consecutive parts (a 3-D stack's slices) as one tensor's fill.
Fill concat_fills(std::vector<std::pair<int64_t, Fill>> parts, DType dt) {
  if (parts.size() == 1) return std::move(parts[0].second);
  return [parts = std::move(parts), dt](int64_t begin, int64_t n, void* dst) {
    int64_t at = 0;  // first element of the current part
    for (const auto& [len, fill] : parts) {
      const int64_t lo = std::max(begin, at), hi = std::min(begin + n, at + len);
      if (lo < hi) fill(lo - at, hi - lo, static_cast<char*>(dst) + dtype_bytes(dt, lo - begin));
      at += len;
    }
  };
}

// An HF checkpoint's tensor (hf_plan): its spec's seeded fill, or its stack's slices in order.
Fill hf_fill(const GgufTensorPlan& t, const SynthOptions& o) {
  std::vector<std::pair<int64_t, Fill>> parts;
  for (const TensorSpec* s : t.parts) parts.emplace_back(numel(s->shape), spec_fill(*s, o.seed, o.dtype));
  return concat_fills(std::move(parts), o.dtype);
}

// A tensor's stored type: the checkpoint's, except in a GGUF the tensors llama.cpp's converter
// always writes F32 (conversion/base.py): 1-D ones (norm weights, biases; llama.cpp refuses
// bf16 norms) and Mamba2's conv1d (ggml's CPU ssm_conv reads f32 kernels only, and aborts on
// a bf16 one). They hold the generator's f32 values (an HF directory rounds them to its dtype).
DType stored_dtype(const TensorSpec& t, const SynthOptions& o) {
  const bool f32 = t.shape.size() == 1 || t.gguf.ends_with("ssm_conv1d.weight");
  return o.format == SynthFormat::Gguf && f32 ? DType::F32 : o.dtype;
}

// The GGUF type of each tensor of plan, in file order: stored_dtype, or under a recipe what
// `arbiter quantize` gives that tensor of the f32 file (its counters run in file order).
std::vector<DType> gguf_types(const std::vector<GgufTensorPlan>& plan, const ModelConfig& c, const SynthOptions& o) {
  std::vector<DType> out;
  std::vector<std::string> names;
  for (const GgufTensorPlan& t : plan) names.push_back(t.name);
  QuantCounters qc = quant_counters(names, c.n_layer);
  for (const GgufTensorPlan& t : plan) {
    const DType stored = stored_dtype(*t.parts[0], o);
    out.push_back(o.quant ? quant_tensor_type(*o.quant, t.name, int(t.shape.size()), t.shape.back(), stored, qc)
                          : stored);
  }
  return out;
}

// general.architecture, context_length and the family's metadata of c.
void add_gguf_config(const ModelConfig& c, GgufWriter& g) {
  const Arch& arch = arch_of(c.arch);
  g.add_string("general.architecture", arch.gguf_arch(c));
  g.add_u32("general.alignment", 32);
  g.add_u32(arch.gguf_arch(c) + ".context_length", uint32_t(c.max_pos));
  arch.gguf_metadata(c, g);
}

void write_gguf_checkpoint(const std::string& path, const SynthPreset& p, const ModelConfig& c,
                           const SynthOptions& o, ThreadPool& pool, Progress& meter) {
  GgufWriter g;
  add_gguf_config(c, g);
  g.add_string("general.name", "arbiter synth " + p.name + " (random weights, speed only)");
  if (o.quant) add_quant_file_type(*o.quant, g);

  const SynthVocab sv = synth_vocab(p, c);
  const int64_t n_special = int64_t(p.specials.size());
  std::vector<int32_t> types(sv.tokens.size(), 1);  // llama_token_type: 1 normal, 3 control
  for (int64_t k = 0; k < n_special; ++k) types[types.size() - size_t(n_special - k)] = 3;
  std::vector<std::string> merges;
  merges.reserve(sv.merges.size());
  for (const auto& [l, r] : sv.merges) merges.push_back(l + " " + r);
  g.add_string("tokenizer.ggml.model", "gpt2");
  g.add_string("tokenizer.ggml.pre", "gpt-2");  // tokenizer.json's ByteLevel(use_regex) split
  g.add_string_array("tokenizer.ggml.tokens", sv.tokens);
  g.add_i32_array("tokenizer.ggml.token_type", types);
  g.add_string_array("tokenizer.ggml.merges", merges);
  if (p.bos >= 0) g.add_u32("tokenizer.ggml.bos_token_id", uint32_t(c.vocab - n_special + p.bos));
  g.add_u32("tokenizer.ggml.eos_token_id", uint32_t(c.vocab - n_special + p.eos));
  g.add_bool("tokenizer.ggml.add_bos_token", p.add_bos);

  // llama.cpp's converter permutes the rows of RoPE'd projections into adjacent pairs where
  // its RoPE for the architecture rotates those.
  const bool adjacent = arch_of(c.arch).gguf_rope_layout(c.arch) == RopeLayout::Adjacent;
  int64_t bytes = 0;
  const std::vector<TensorSpec> list = tensor_list(c);
  const std::vector<GgufTensorPlan> plan = gguf_plan(list);
  const std::vector<DType> dtypes = gguf_types(plan, c, o);
  for (size_t k = 0; k < plan.size(); ++k) {
    const GgufTensorPlan& t = plan[k];
    GgufTensorEntry e;
    e.name = t.name;
    e.dtype = dtypes[k];
    e.shape = t.shape;
    const DType gen = stored_dtype(*t.parts[0], o);  // the values as generated
    std::vector<std::pair<int64_t, Fill>> parts;
    for (const TensorSpec* s : t.parts) {
      ARB_ASSERT(s->gguf_offset == 0 || s->kind == TensorKind::Norm);  // only ones are offset
      Fill fill = spec_fill(*s, o.seed, gen,
                            adjacent && s->rope_rows ? rope_adjacent_rows(c.head_dim) : nullptr,
                            s->gguf_offset);
      if (s->gguf_value == TensorSpec::GgufValue::NegExp) {
        // The HF values' -exp (Mamba2's A from A_log), as llama.cpp's converter stores them;
        // such tensors are 1-D in HF, so stored f32.
        ARB_ASSERT(gen == DType::F32);
        fill = [fill = std::move(fill)](int64_t begin, int64_t n, void* dst) {
          fill(begin, n, dst);
          float* f = static_cast<float*>(dst);
          for (int64_t i = 0; i < n; ++i) f[i] = float(-std::exp(double(f[i])));
        };
      }
      parts.emplace_back(numel(s->shape), std::move(fill));
    }
    Fill fill = concat_fills(std::move(parts), gen);
    if (e.dtype != gen) {
      // The recipe's encoding of the f32 values, a chunk (whole blocks) at a time.
      ARB_ASSERT(gen == DType::F32);
      fill = [fill = std::move(fill), to = e.dtype](int64_t begin, int64_t n, void* dst) {
        std::vector<float> x(static_cast<size_t>(n));
        fill(begin, n, x.data());
        encode_f32(to, x.data(), n, dst);
      };
    }
    e.fill = metered(std::move(fill), e.dtype, pool, meter, bytes);
    g.add_tensor(std::move(e));
  }
  g.write(path);
}

void write_text(const std::string& path, const std::string& text) { write_file_atomic(path, text, "[synth]"); }

}  // namespace

void add_model_gguf(const Model& m, GgufWriter& g) {
  const ModelConfig& c = m.config;
  add_gguf_config(c, g);
  // An HF model's rows and values become llama.cpp's; a GGUF model's already are (but its
  // transformed values were inverted at load).
  const bool hf = m.format == "hf";
  const bool adjacent = hf && m.arch->gguf_rope_layout(c.arch) == RopeLayout::Adjacent;
  // The specs as bound, less a tied lm_head (GGUF ties by leaving output.weight out).
  std::vector<TensorSpec> list;
  for (const TensorSpec& s : m.weights.specs)
    if (!(s.tie_to && c.tied_embeddings)) list.push_back(s);
  for (const GgufTensorPlan& t : gguf_plan(list)) {
    GgufTensorEntry e;
    e.name = t.name;
    e.dtype = DType::F32;
    e.shape = t.shape;
    std::vector<std::pair<int64_t, Fill>> parts;
    for (const TensorSpec* s : t.parts) {
      const Tensor& w = m.weights.at(*s);
      const auto src_row = adjacent && s->rope_rows ? rope_adjacent_rows(c.head_dim) : nullptr;
      const double offset = hf ? s->gguf_offset : 0;
      const bool neg_exp = s->gguf_value == TensorSpec::GgufValue::NegExp;
      // Element i of the written tensor: HF row src_row(i / cols), column i % cols, plus the
      // offset, or -exp of it (llama.cpp's A = -exp(A_log)), rounded once to f32.
      parts.emplace_back(w.numel(), [w, src_row, offset, neg_exp](int64_t begin, int64_t n, void* dst) {
        const int64_t cols = w.cols();
        std::vector<double> row(static_cast<size_t>(cols));
        float* out = static_cast<float*>(dst);
        for (int64_t i = begin; i < begin + n;) {
          const int64_t r = i / cols, c0 = i % cols, len = std::min(begin + n - i, cols - c0);
          row_to_f64(w.dtype, w.row(src_row ? src_row(r) : r), row.data(), cols);
          for (int64_t k = 0; k < len; ++k) {
            const double v = row[size_t(c0 + k)] + offset;
            out[i - begin + k] = float(neg_exp ? -std::exp(v) : v);
          }
          i += len;
        }
      });
    }
    e.fill = concat_fills(std::move(parts), DType::F32);
    g.add_tensor(std::move(e));
  }
}

// ---------------------------------------------------------------------------------------

std::string byte_level_char(uint8_t b) {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
  // bytes map to U+0100.. in byte order.
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  uint32_t cp = b;
  if (!printable(b)) {
    int k = 0;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++k;
    cp = 256 + uint32_t(k);
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

const std::vector<SynthPreset>& synth_presets() {
  static const std::vector<SynthPreset> presets = [] {
    std::vector<SynthPreset> all;
    for (const Arch* a : arch_registry())
      for (SynthPreset& p : a->presets()) all.push_back(std::move(p));
    return all;
  }();
  return presets;
}

const SynthPreset& synth_preset(const std::string& name) {
  std::string names;
  for (const SynthPreset& p : synth_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw Error("[synth] unknown preset '" + name + "' (presets: " + names + ")");
}

SynthResult synth_plan(const SynthOptions& opt) {
  const SynthPreset& p = synth_preset(opt.preset);
  ARB_CHECK(opt.dtype == DType::BF16 || opt.dtype == DType::F16 || opt.dtype == DType::F32,
            "[synth] dtype %s not supported (expected bf16, f16, f32 or, for GGUF, a quantize recipe: "
            "q8_0, q4_0, q6_k, q4_k_m, q5_k_m, mxfp4)", dtype_name(opt.dtype));
  if (opt.quant) {
    ARB_CHECK(opt.format == SynthFormat::Gguf,
              "[synth] --dtype %s is a GGUF recipe: write it with --format gguf (for MLX's quantized layout, "
              "synth an HF checkpoint and run `arbiter quantize --mlx`)",
              quant_recipe_name(*opt.quant));
    ARB_ASSERT(opt.dtype == DType::F32);  // the recipe encodes f32 values
  }
  ARB_CHECK(opt.layers >= 0 && opt.layers <= 1000, "[synth] --layers %d outside [1, 1000]", opt.layers);
  SynthResult r;
  r.config = p.config;
  if (opt.layers > 0) {
    // Per-layer attention types (gemma) keep the preset's periodic pattern.
    std::vector<bool>& sl = r.config.layer_sliding;
    const size_t n0 = sl.size();
    if (n0 > 0) {
      sl.resize(size_t(opt.layers));
      for (size_t l = n0; l < sl.size(); ++l) sl[l] = sl[l % n0];
    }
    r.config.n_layer = opt.layers;
    // So do the hybrids' per-layer blocks (their count is the layer count).
    std::string& blocks = r.config.layer_blocks;
    const size_t b0 = blocks.size();
    if (b0 > 0) {
      blocks.resize(size_t(opt.layers));
      for (size_t l = b0; l < blocks.size(); ++l) blocks[l] = blocks[l % b0];
    }
  }
  // MoE presets route every layer, so fewer (or more) layers keep that.
  if (!r.config.layer_moe.empty()) r.config.layer_moe.assign(size_t(r.config.n_layer), true);
  const std::vector<TensorSpec> list = tensor_list(r.config);
  for (const TensorSpec& t : list) r.n_params += numel(t.shape);
  if (!opt.quant) {
    for (const TensorSpec& t : list) r.weight_bytes += dtype_bytes(stored_dtype(t, opt), numel(t.shape));
    return r;
  }
  const std::vector<GgufTensorPlan> plan = gguf_plan(list);
  const std::vector<DType> types = gguf_types(plan, r.config, opt);
  for (size_t k = 0; k < plan.size(); ++k) r.weight_bytes += dtype_bytes(types[k], numel(plan[k].shape));
  return r;
}

std::string synth_config_json(const SynthOptions& opt) {
  return config_json(synth_preset(opt.preset), synth_plan(opt).config, opt);
}

std::unique_ptr<Model> synth_model(const SynthOptions& opt) {
  const SynthPreset& p = synth_preset(opt.preset);
  ARB_CHECK(opt.format == SynthFormat::Hf, "[synth] %s: an in-memory model is built as the HF checkpoint",
            p.name.c_str());
  const SynthResult r = synth_plan(opt);
  const ModelConfig& c = r.config;
  const std::vector<TensorSpec> list = tensor_list(c);
  // One host buffer for every tensor, the model's only copy: the cuda tier uploads from it as
  // from a file mapping (the cpu tier's huge-page copy is its own, docs/performance.md).
  const size_t align = 64;
  size_t total = 0;
  const std::vector<GgufTensorPlan> tensors = hf_plan(list);
  for (const GgufTensorPlan& t : tensors)
    total += (dtype_bytes(opt.dtype, numel(t.shape)) + align - 1) / align * align;
  std::shared_ptr<char[]> storage;
  try {
    storage.reset(new char[std::max<size_t>(total, 1)]);
  } catch (const std::bad_alloc&) {
    throw Error(strformat("[synth] %s: cannot allocate %.2f GB of host memory for the weights", p.name.c_str(),
                          total / 1e9));
  }
  HfInMemory src;
  src.path = "synth:" + p.name;
  src.format = "synth (in memory)";
  src.weights_id = strformat("synth %s seed %llu %s%s", p.name.c_str(), (unsigned long long)opt.seed,
                             dtype_name(opt.dtype),
                             opt.layers > 0 ? (" layers " + std::to_string(opt.layers)).c_str() : "");
  Progress meter("synth", int64_t(r.weight_bytes), "", Progress::Unit::Bytes, opt.progress);
  if (opt.progress)
    progress_note("synth", strformat("building %s in memory (%zu tensors, %.2f GB)", p.name.c_str(), list.size(),
                                     r.weight_bytes / 1e9));
  ThreadPool pool(opt.threads);
  int64_t bytes = 0;
  size_t off = 0;
  for (const GgufTensorPlan& t : tensors) {
    Tensor x;
    x.name = t.name;
    x.dtype = opt.dtype;
    x.shape = t.shape;
    char* dst = storage.get() + off;
    x.data = dst;
    // The writer's fill, called as the safetensors writer calls it: the same bytes.
    metered(hf_fill(t, opt), opt.dtype, pool, meter, bytes)(0, numel(t.shape), dst);
    off += (x.nbytes() + align - 1) / align * align;
    src.tensors.emplace(t.name, std::move(x));
  }
  meter.finish();
  src.storage = std::shared_ptr<const void>(storage, storage.get());
  src.config_text = config_json(p, c, opt);
  src.tokenizer_json = tokenizer_json(p, c);
  src.tokenizer_config_json = tokenizer_config_json(p, c);
  src.eos_ids = {int32_t(int64_t(c.vocab) - int64_t(p.specials.size()) + p.eos)};  // generation_config's
  return load_hf_in_memory(std::move(src));
}

SynthResult synth_checkpoint(const SynthOptions& opt) {
  const SynthPreset& p = synth_preset(opt.preset);
  SynthResult r = synth_plan(opt);
  const ModelConfig& c = r.config;
  ARB_CHECK(!opt.out_dir.empty(), "[synth] no output path given");
  fs::path out = fs::absolute(fs::path(opt.out_dir)).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  std::error_code ec;
  // --force replaces a checkpoint (a directory or a file), never a device, FIFO or socket.
  const fs::file_status st = fs::status(out, ec);
  if (fs::exists(st) && !fs::is_directory(st) && !fs::is_regular_file(st))
    throw Error("[synth] " + out.string() + ": is not a directory or a regular file; refusing to replace it");
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)) && !opt.force)
    throw Error("[synth] " + out.string() + ": exists and is not empty (pass --force to replace it)");
  fs::path parent = out.parent_path();
  fs::create_directories(parent, ec);
  if (ec) throw Error("[synth] " + parent.string() + ": cannot create (" + ec.message() + ")");
  fs::space_info sp = fs::space(parent, ec);
  const uint64_t need = r.weight_bytes + (64u << 20);
  if (!ec && sp.available < need)
    throw Error(strformat("[synth] %s: %.2f GB free, the checkpoint needs %.2f GB", parent.string().c_str(),
                          sp.available / 1e9, need / 1e9));

  auto say = [&](const std::string& s) {
    if (opt.progress) progress_note("synth", s);
  };
  Progress meter("synth", int64_t(r.weight_bytes), "", Progress::Unit::Bytes, opt.progress);
  ThreadPool pool(opt.threads);
  if (opt.format == SynthFormat::Gguf) {
    if (fs::is_directory(out, ec))
      throw Error("[synth] " + out.string() + ": is a directory (a GGUF checkpoint is one file)");
    say(strformat("writing %s (GGUF, %.2f GB)", out.string().c_str(), r.weight_bytes / 1e9));
    write_gguf_checkpoint(out.string(), p, c, opt, pool, meter);
    meter.finish();
    return r;
  }

  // What a killed synth left beside out (its temporary, or a replaced checkpoint moved aside).
  for (const char* kind : {".synth-tmp-", ".synth-old-"})
    remove_dead_process_entries(parent.empty() ? "." : parent.string(), "." + out.filename().string() + kind, true);
  const fs::path tmp = parent / ("." + out.filename().string() + ".synth-tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error("[synth] " + tmp.string() + ": cannot create (" + ec.message() + ")");
  try {
    std::vector<SafetensorsEntry> entries;
    const std::vector<TensorSpec> list = tensor_list(c);
    std::vector<GgufTensorPlan> tensors = hf_plan(list);
    int64_t bytes = 0;
    std::sort(tensors.begin(), tensors.end(),
              [](const GgufTensorPlan& a, const GgufTensorPlan& b) { return a.name < b.name; });
    for (const GgufTensorPlan& t : tensors) {
      SafetensorsEntry e;
      e.name = t.name;
      e.dtype = opt.dtype;
      e.shape = t.shape;
      e.fill = metered(hf_fill(t, opt), opt.dtype, pool, meter, bytes);
      entries.push_back(std::move(e));
    }
    say(strformat("writing model.safetensors (%zu tensors, %.2f GB)", entries.size(), r.weight_bytes / 1e9));
    write_safetensors((tmp / "model.safetensors").string(), entries,
                      {{"format", "pt"}, {"arbiter_synth", p.name + " seed " + std::to_string(opt.seed)}});
    meter.finish();
    say("writing tokenizer.json (" + std::to_string(c.vocab) + " tokens)");
    write_text((tmp / "tokenizer.json").string(), tokenizer_json(p, c));
    write_text((tmp / "config.json").string(), config_json(p, c, opt));
    write_text((tmp / "tokenizer_config.json").string(), tokenizer_config_json(p, c));
    write_text((tmp / "generation_config.json").string(), generation_config_json(p, c));
    write_text((tmp / "README.md").string(), readme(p, c, opt, r));

    // Swap into place: an existing directory (only with force) is moved aside first and
    // removed after the rename, so out never holds a half-written checkpoint.
    fs::path old;
    if (fs::exists(out, ec)) {
      old = parent / ("." + out.filename().string() + ".synth-old-" + std::to_string(::getpid()));
      fs::remove_all(old, ec);
      fs::rename(out, old, ec);
      if (ec) throw Error("[synth] " + out.string() + ": cannot move the old directory aside (" + ec.message() + ")");
    }
    fs::rename(tmp, out, ec);
    if (ec) throw Error("[synth] " + out.string() + ": rename from " + tmp.string() + " failed (" + ec.message() + ")");
    if (!old.empty()) fs::remove_all(old, ec);
  } catch (...) {
    std::error_code ec2;
    fs::remove_all(tmp, ec2);
    throw;
  }
  return r;
}

}  // namespace arbiter
