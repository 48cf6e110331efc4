// GGUF reader: the shipped stories260K.gguf against its documented header values and
// against the llama2.c .bin it was converted from; a hand-built file with every metadata
// type and F32/F16/BF16/Q8_0 tensors of known values; one test per refusal; and seeded
// truncation / byte-mutation runs where every attempt must load or throw arbiter::Error.
// Add a refusal case: build a GgufBuilder, break one field, expect_refused(bytes, "words").
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "io/io_test_util.h"

using namespace arbiter;
using test::GgufBuilder;
using test::put;

namespace {

std::string write_tmp(const std::string& bytes, const std::string& name = "t.gguf") {
  std::string p = test::temp_dir("gguf") + "/" + name;
  test::write_file(p, bytes);
  return p;
}

// Expects GgufFile to refuse the bytes with an Error whose message contains `words`.
void expect_refused(const std::string& bytes, const std::string& words) {
  std::string p = write_tmp(bytes);
  try {
    GgufFile g(p);
    ADD_FAILURE() << "accepted; expected an error containing '" << words << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[gguf]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << "message: " << msg << "\nexpected: " << words;
  }
}

std::vector<float> read_floats(const std::string& path, size_t offset_floats, size_t n, size_t header_bytes) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(header_bytes + offset_floats * 4));
  std::vector<float> v(n);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
  return v;
}

std::vector<float> tensor_floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  row_to_f32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

}  // namespace

// ---- the shipped model ------------------------------------------------------------------

TEST(GgufReal, Stories260kHeaderAndMetadata) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found (models/ or ../shared/models/)";
  GgufFile g(path);
  // Values from models/README.md (stories260K.gguf section).
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.tensors().size(), 48u);
  EXPECT_EQ(g.metadata().size(), 19u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.data_offset(), 14176u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_string("general.name"), "llama");
  EXPECT_EQ(g.get_int("llama.context_length"), 2048);
  EXPECT_EQ(g.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(g.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(g.get_int("llama.block_count"), 5);
  EXPECT_EQ(g.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(g.get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(g.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5);  // f32 shown as its decimal
  EXPECT_EQ(float(g.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_FALSE(g.has("llama.rope.freq_base"));
  EXPECT_FALSE(g.has("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(g.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(g.get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(g.get_int("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(g.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(g.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(g.get_int("tokenizer.ggml.padding_token_id"), 0xFFFFFFFFll);
  std::map<int64_t, int> types;
  for (int64_t t : g.get_int_array("tokenizer.ggml.token_type")) ++types[t];
  EXPECT_EQ(types, (std::map<int64_t, int>{{1, 253}, {2, 1}, {3, 2}, {6, 256}}));
}

TEST(GgufReal, Stories260kTensorShapes) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  GgufFile g(path);
  // README lists ggml dims [ne0, ne1]; our shapes are reversed.
  auto shape = [&](const std::string& n) {
    const Tensor* t = g.tensor(n);
    EXPECT_NE(t, nullptr) << n;
    return t ? t->shape : std::vector<int64_t>{};
  };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("token_embd.weight"), (S{512, 64}));
  EXPECT_EQ(shape("output_norm.weight"), (S{64}));
  EXPECT_EQ(shape("output.weight"), (S{512, 64}));
  for (int l = 0; l < 5; ++l) {
    std::string b = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(shape(b + "attn_q.weight"), (S{64, 64}));
    EXPECT_EQ(shape(b + "attn_k.weight"), (S{32, 64}));
    EXPECT_EQ(shape(b + "attn_v.weight"), (S{32, 64}));
    EXPECT_EQ(shape(b + "attn_output.weight"), (S{64, 64}));
    EXPECT_EQ(shape(b + "attn_norm.weight"), (S{64}));
    EXPECT_EQ(shape(b + "ffn_gate.weight"), (S{172, 64}));
    EXPECT_EQ(shape(b + "ffn_down.weight"), (S{64, 172}));
    EXPECT_EQ(shape(b + "ffn_up.weight"), (S{172, 64}));
    EXPECT_EQ(shape(b + "ffn_norm.weight"), (S{64}));
  }
  int64_t total = 0;
  for (const Tensor& t : g.tensors()) {
    EXPECT_EQ(t.dtype, DType::F32) << t.name;
    total += t.numel();
  }
  EXPECT_EQ(total, 292800);  // README: 292,800 floats in the GGUF
  EXPECT_EQ(g.tensor("no.such.tensor"), nullptr);
}

TEST(GgufReal, Stories260kDataEqualsLlama2cBin) {
  // The README says the GGUF weights are a straight copy of the llama2.c arrays; reading
  // them back through our offsets must give the .bin's floats (an independent layout).
  std::string path = test::stories260k_gguf();
  std::string bin = test::model_path("stories260K/stories260K.bin");
  if (path.empty() || bin.empty()) GTEST_SKIP() << "stories260K.gguf / .bin not found";
  GgufFile g(path);
  const size_t hdr = 7 * 4, D = 64, F = 172, L = 5, V = 512, KV = 32;
  const size_t emb = 0, rms_att = emb + V * D, wq = rms_att + L * D, wk = wq + L * D * D, wv = wk + L * KV * D,
               wo = wv + L * KV * D, rms_ffn = wo + L * D * D, w1 = rms_ffn + L * D, w2 = w1 + L * F * D,
               w3 = w2 + L * D * F, rms_final = w3 + L * F * D;
  EXPECT_EQ(tensor_floats(*g.tensor("token_embd.weight")), read_floats(bin, emb, V * D, hdr));
  EXPECT_EQ(tensor_floats(*g.tensor("output.weight")), read_floats(bin, emb, V * D, hdr));  // shared classifier
  EXPECT_EQ(tensor_floats(*g.tensor("output_norm.weight")), read_floats(bin, rms_final, D, hdr));
  for (size_t l = 0; l < L; ++l) {
    std::string b = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(tensor_floats(*g.tensor(b + "attn_norm.weight")), read_floats(bin, rms_att + l * D, D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "attn_q.weight")), read_floats(bin, wq + l * D * D, D * D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "attn_k.weight")), read_floats(bin, wk + l * KV * D, KV * D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "attn_v.weight")), read_floats(bin, wv + l * KV * D, KV * D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "attn_output.weight")), read_floats(bin, wo + l * D * D, D * D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "ffn_norm.weight")), read_floats(bin, rms_ffn + l * D, D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "ffn_gate.weight")), read_floats(bin, w1 + l * F * D, F * D, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "ffn_down.weight")), read_floats(bin, w2 + l * D * F, D * F, hdr));
    EXPECT_EQ(tensor_floats(*g.tensor(b + "ffn_up.weight")), read_floats(bin, w3 + l * F * D, F * D, hdr));
  }
}

// ---- a hand-built file --------------------------------------------------------------------

namespace {

GgufBuilder small_writer() {
  GgufBuilder w;
  w.kv("t.u8", 0, uint8_t(200));
  w.kv("t.i8", 1, int8_t(-100));
  w.kv("t.u16", 2, uint16_t(60000));
  w.kv("t.i16", 3, int16_t(-30000));
  w.kv("t.u32", 4, uint32_t(4000000000u));
  w.kv("t.i32", 5, int32_t(-2000000000));
  w.kv("t.f32", 6, 0.25f);
  w.kv("t.bool", 7, uint8_t(1));
  w.kv_string("t.str", "h\xc3\xa9llo");
  w.kv("t.u64", 10, uint64_t(0x8000000000000005ull));
  w.kv("t.i64", 11, int64_t(-(int64_t(1) << 62)));
  w.kv("t.f64", 12, 1e-300);
  auto arr = [&](const std::string& key, uint32_t et, const std::string& elems, uint64_t n) {
    std::string b;
    put<uint32_t>(b, et);
    put<uint64_t>(b, n);
    w.kv_raw(key, 9, b + elems);
  };
  std::string e;
  e.clear(); put<uint8_t>(e, 1); put<uint8_t>(e, 2); put<uint8_t>(e, 255); arr("a.u8", 0, e, 3);
  e.clear(); put<int8_t>(e, -7); arr("a.i8", 1, e, 1);
  e.clear(); put<uint16_t>(e, 65535); arr("a.u16", 2, e, 1);
  e.clear(); put<int16_t>(e, -1); put<int16_t>(e, 2); arr("a.i16", 3, e, 2);
  e.clear(); put<uint32_t>(e, 7); arr("a.u32", 4, e, 1);
  e.clear(); put<int32_t>(e, -8); arr("a.i32", 5, e, 1);
  e.clear(); put<float>(e, 0.5f); put<float>(e, -1.5f); arr("a.f32", 6, e, 2);
  e.clear(); put<uint8_t>(e, 1); put<uint8_t>(e, 0); put<uint8_t>(e, 1); arr("a.bool", 7, e, 3);
  w.kv_string_array("a.str", {"a", "", "bc"});
  e.clear(); put<uint64_t>(e, 9); arr("a.u64", 10, e, 1);
  e.clear(); put<int64_t>(e, -9); arr("a.i64", 11, e, 1);
  e.clear(); put<double>(e, 2.5); arr("a.f64", 12, e, 1);
  arr("a.empty", 4, "", 0);

  // F32 [3]
  w.add_f32("f32", {3}, {1.5f, -0.25f, 1e-3f});
  // F16 ggml [3, 2] -> shape [2, 3]: 1, -2, 0.5 / 65504, 2^-24, -0 (IEEE 754 binary16 codes).
  std::string h;
  for (uint16_t c : {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000}) put<uint16_t>(h, c);
  w.add_tensor("f16", {3, 2}, 1, h);
  // BF16 ggml [2, 2]: 1, -2, 0.15625, 3 (upper halves of the f32 codes).
  std::string bf;
  for (uint16_t c : {0x3F80, 0xC000, 0x3E20, 0x4040}) put<uint16_t>(bf, c);
  w.add_tensor("bf16", {2, 2}, 30, bf);
  // Q8_0 ggml [32, 2]: block 0 d=0.5 q=j-16; block 1 d=-1 q=4j-64 (ggml block_q8_0: f16 d, 32 x int8).
  std::string q;
  put<uint16_t>(q, 0x3800);
  for (int j = 0; j < 32; ++j) put<int8_t>(q, int8_t(j - 16));
  put<uint16_t>(q, 0xBC00);
  for (int j = 0; j < 32; ++j) put<int8_t>(q, int8_t(4 * j - 64));
  w.add_tensor("q8", {32, 2}, 8, q);
  return w;
}

}  // namespace

TEST(GgufSmall, EveryMetadataType) {
  GgufFile g(write_tmp(small_writer().build()));
  EXPECT_EQ(g.metadata().size(), 25u);
  EXPECT_EQ(g.get_int("t.u8"), 200);
  EXPECT_EQ(g.get_int("t.i8"), -100);
  EXPECT_EQ(g.get_int("t.u16"), 60000);
  EXPECT_EQ(g.get_int("t.i16"), -30000);
  EXPECT_EQ(g.get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(g.get_int("t.i32"), -2000000000ll);
  EXPECT_EQ(g.get_float("t.f32"), 0.25);
  EXPECT_EQ(g.get_float_array("a.f32"), (std::vector<double>{0.5, -1.5}));
  EXPECT_TRUE(g.get_bool("t.bool"));
  EXPECT_EQ(g.get_string("t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(g.find("t.u64")->u, 0x8000000000000005ull);
  EXPECT_THROW(g.get_int("t.u64"), Error);  // does not fit int64
  EXPECT_EQ(g.get_int("t.i64"), -(int64_t(1) << 62));
  EXPECT_EQ(g.get_float("t.f64"), 1e-300);
  EXPECT_EQ(g.find("t.u16")->type, 2u);
  EXPECT_EQ(g.find("t.f32")->kind, GgufValue::Kind::F64);

  EXPECT_EQ(g.get_int_array("a.u8"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(g.get_int_array("a.i8"), (std::vector<int64_t>{-7}));
  EXPECT_EQ(g.get_int_array("a.u16"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(g.get_int_array("a.i16"), (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(g.get_int_array("a.u32"), (std::vector<int64_t>{7}));
  EXPECT_EQ(g.get_int_array("a.i32"), (std::vector<int64_t>{-8}));
  EXPECT_EQ(g.get_float_array("a.f32"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(g.find("a.bool")->kind, GgufValue::Kind::ArrBool);
  EXPECT_EQ(g.find("a.bool")->au, (std::vector<uint64_t>{1, 0, 1}));
  EXPECT_EQ(g.get_string_array("a.str"), (std::vector<std::string>{"a", "", "bc"}));
  EXPECT_EQ(g.get_int_array("a.u64"), (std::vector<int64_t>{9}));
  EXPECT_EQ(g.get_int_array("a.i64"), (std::vector<int64_t>{-9}));
  EXPECT_EQ(g.get_float_array("a.f64"), (std::vector<double>{2.5}));
  EXPECT_EQ(g.find("a.f64")->elem_type, 12u);
  EXPECT_TRUE(g.get_int_array("a.empty").empty());
  EXPECT_EQ(g.get_float_array("a.i16"), (std::vector<double>{-1, 2}));

  // Getters: wrong kinds and missing keys name the key; defaults for absent keys only.
  for (auto fn : {+[](const GgufFile& f) { f.get_string("t.u8"); }, +[](const GgufFile& f) { f.get_bool("t.str"); },
                  +[](const GgufFile& f) { f.get_int("t.f32"); }, +[](const GgufFile& f) { f.get_float("t.str"); },
                  +[](const GgufFile& f) { f.get_string_array("a.u8"); },
                  +[](const GgufFile& f) { f.get_int_array("a.str"); }, +[](const GgufFile& f) { f.get_int("nope"); }}) {
    try {
      fn(g);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key '"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(g.get_int("nope", 7), 7);
  EXPECT_EQ(g.get_float("nope", 1.5), 1.5);
  EXPECT_EQ(g.get_string("nope", "x"), "x");
  EXPECT_FALSE(g.get_bool("nope", false));
  EXPECT_THROW(g.get_int("t.str", 3), Error);  // present with the wrong kind: no default
}

TEST(GgufSmall, TensorsOfEveryDtype) {
  GgufFile g(write_tmp(small_writer().build()));
  ASSERT_EQ(g.tensors().size(), 4u);
  EXPECT_EQ(g.tensors()[0].name, "f32");  // file order kept
  const Tensor* f32 = g.tensor("f32");
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(tensor_floats(*f32), (std::vector<float>{1.5f, -0.25f, 1e-3f}));

  const Tensor* f16 = g.tensor("f16");
  EXPECT_EQ(f16->dtype, DType::F16);
  EXPECT_EQ(f16->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> v = tensor_floats(*f16);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f}));
  EXPECT_TRUE(std::signbit(v[5]));
  float r1[3];
  row_to_f32(f16->dtype, f16->row(1), r1, 3);  // row 1 = ggml's second ne0-run
  EXPECT_EQ(r1[0], 65504.0f);

  const Tensor* bf = g.tensor("bf16");
  EXPECT_EQ(bf->dtype, DType::BF16);
  EXPECT_EQ(tensor_floats(*bf), (std::vector<float>{1.0f, -2.0f, 0.15625f, 3.0f}));

  const Tensor* q8 = g.tensor("q8");
  EXPECT_EQ(q8->dtype, DType::Q8_0);
  EXPECT_EQ(q8->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(q8->nbytes(), 68u);
  v = tensor_floats(*q8);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(v[j], 0.5f * float(j - 16)) << j;
    EXPECT_EQ(v[32 + j], -1.0f * float(4 * j - 64)) << j;
  }
  // Data starts at the first multiple of 32 after the tensor infos; tensors follow aligned.
  EXPECT_EQ(g.data_offset() % 32, 0u);
  const uint8_t* base = g.file()->data();
  for (const Tensor& t : g.tensors())
    EXPECT_EQ(size_t(static_cast<const uint8_t*>(t.data) - base - g.data_offset()) % 32, 0u) << t.name;
}

TEST(GgufSmall, CustomAlignmentAndVersion2) {
  GgufBuilder w = small_writer();
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  w.version = 2;
  GgufFile g(write_tmp(w.build()));
  EXPECT_EQ(g.version(), 2u);
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.data_offset() % 64, 0u);
  EXPECT_EQ(tensor_floats(*g.tensor("bf16")), (std::vector<float>{1.0f, -2.0f, 0.15625f, 3.0f}));
}

TEST(GgufSmall, NoTensorsAndNoDataSection) {
  GgufBuilder w;
  w.kv_string("general.architecture", "llama");
  std::string b = w.build();
  GgufFile g(write_tmp(b));
  EXPECT_TRUE(g.tensors().empty());
  // Also without the trailing padding (vocab-only files end right after the metadata).
  std::string raw = "GGUF";
  put<uint32_t>(raw, 3);
  put<uint64_t>(raw, 0);
  put<uint64_t>(raw, 0);
  GgufFile g2(write_tmp(raw));
  EXPECT_TRUE(g2.metadata().empty());
}

// ---- refusals -------------------------------------------------------------------------

namespace {
std::string header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  std::string s = "GGUF";
  put<uint32_t>(s, version);
  put<uint64_t>(s, n_tensors);
  put<uint64_t>(s, n_kv);
  return s;
}
// One tensor info with the given fields, then padding and `data_bytes` of data.
std::string one_tensor(uint32_t n_dims, std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes,
                       const std::string& kvs = "", uint64_t n_kv = 0) {
  std::string s = header(3, 1, n_kv) + kvs;
  test::put_str(s, "w");
  put<uint32_t>(s, n_dims);
  for (uint64_t d : ne) put<uint64_t>(s, d);
  put<uint32_t>(s, type);
  put<uint64_t>(s, offset);
  while (s.size() % 32) s += '\0';
  return s + std::string(data_bytes, '\0');
}
}  // namespace

TEST(GgufRefuse, HeaderFields) {
  expect_refused("", "magic");
  expect_refused("GGU", "magic");
  expect_refused("GGML" + std::string(20, '\0'), "not a GGUF file");
  expect_refused(header(1, 0, 0), "version 1");
  expect_refused(header(4, 0, 0), "unsupported GGUF version 4");
  expect_refused(header(0x03000000, 0, 0), "big-endian");
  expect_refused(header(3, 0, 0).substr(0, 20), "kv count");
  expect_refused(header(3, 0, uint64_t(1) << 62), "kv count");
  expect_refused(header(3, uint64_t(1) << 62, 0), "tensor count");
}

TEST(GgufRefuse, HugeLengthsAreErrorsNotAllocations) {
  // Key length 2^60: must be an Error before any allocation (no bad_alloc).
  std::string s = header(3, 0, 1);
  put<uint64_t>(s, uint64_t(1) << 60);
  s += std::string(64, 'x');
  expect_refused(s, "length 1152921504606846976");
  // String value length 2^64-1.
  GgufBuilder w;
  std::string v;
  put<uint64_t>(v, ~uint64_t(0));
  w.kv_raw("k", 8, v);
  expect_refused(w.build(), "string value");
  // Array of 2^60 u8 / 2^61 strings.
  for (uint32_t et : {0u, 8u}) {
    GgufBuilder a;
    std::string b;
    put<uint32_t>(b, et);
    put<uint64_t>(b, uint64_t(1) << 60);
    a.kv_raw("arr", 9, b + "xxxxxxxx");
    expect_refused(a.build(), "elements");
  }
}

TEST(GgufRefuse, MetadataDefects) {
  GgufBuilder a;
  std::string b;
  put<uint32_t>(b, 9);  // array of arrays
  put<uint64_t>(b, 1);
  a.kv_raw("nested", 9, b + std::string(16, '\0'));
  expect_refused(a.build(), "arrays of arrays");

  GgufBuilder t;
  t.kv_raw("bad", 13, "\0\0\0\0");
  expect_refused(t.build(), "unknown value type 13");

  GgufBuilder bad_elem;
  std::string e;
  put<uint32_t>(e, 77);
  put<uint64_t>(e, 1);
  bad_elem.kv_raw("arr", 9, e + "x");
  expect_refused(bad_elem.build(), "unknown element type 77");

  GgufBuilder boolw;
  boolw.kv("b", 7, uint8_t(2));
  expect_refused(boolw.build(), "expected 0 or 1");

  GgufBuilder dup;
  dup.kv_u32("k", 1);
  dup.kv_u32("k", 2);
  expect_refused(dup.build(), "duplicate metadata key 'k'");

  for (uint32_t al : {0u, 3u, 48u}) {
    GgufBuilder w;
    w.kv_u32("general.alignment", al);
    expect_refused(w.build(), "power of two");
  }
  GgufBuilder w64;
  w64.kv("general.alignment", 10, uint64_t(32));
  expect_refused(w64.build(), "expected UINT32");
}

TEST(GgufRefuse, TensorInfoDefects) {
  expect_refused(one_tensor(2, {4, 4}, 2, 0, 64), "Q4_0 row length 4 is not a multiple of its block of 32");
  expect_refused(one_tensor(2, {4, 4}, 12, 0, 64), "Q4_K row length 4 is not a multiple of its block of 256");
  expect_refused(one_tensor(2, {256, 1}, 12, 0, 143), "runs past end of file");  // one Q4_K block is 144 bytes
  expect_refused(one_tensor(2, {4, 4}, 16, 0, 64), "'w' has ggml type IQ2_XXS");
  expect_refused(one_tensor(2, {4, 4}, 999, 0, 64), "type 999");
  expect_refused(one_tensor(5, {1, 1, 1, 1, 1}, 0, 0, 64), "5 dimensions");
  expect_refused(one_tensor(0, {}, 0, 0, 64), "0 dimensions");
  expect_refused(one_tensor(2, {4, 0}, 0, 0, 64), "dimension 1 is 0");
  expect_refused(one_tensor(2, {uint64_t(1) << 32, uint64_t(1) << 32}, 0, 0, 64), "overflows");
  expect_refused(one_tensor(1, {~uint64_t(0)}, 0, 0, 64), "dimension 0");
  expect_refused(one_tensor(2, {16, 2}, 8, 0, 64), "not a multiple of its block of 32");
  expect_refused(one_tensor(1, {4}, 0, 8, 64), "not a multiple of the alignment");
  expect_refused(one_tensor(1, {4}, 0, 0, 15), "runs past end of file");
  expect_refused(one_tensor(1, {4}, 0, 64, 64), "runs past end of file");
  expect_refused(one_tensor(1, {4}, 0, uint64_t(1) << 63, 64), "runs past end of file");
  expect_refused(one_tensor(1, {uint64_t(1) << 61}, 0, 0, 64), "runs past end of file");

  // general.alignment 1 is legal, but an F32 view must still be 4-byte aligned: of four
  // consecutive data offsets exactly three are refused.
  int misaligned = 0;
  for (uint64_t off = 0; off < 4; ++off) {
    std::string kv;
    test::put_str(kv, "general.alignment");
    put<uint32_t>(kv, 4);
    put<uint32_t>(kv, 1);
    std::string p = write_tmp(one_tensor(1, {1}, 0, off, 64, kv, 1));
    try {
      GgufFile g(p);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not aligned to 4 bytes"), std::string::npos) << e.what();
      ++misaligned;
    }
  }
  EXPECT_EQ(misaligned, 3);

  GgufBuilder dup;
  dup.add_f32("x", {1}, {1.0f});
  dup.add_f32("x", {1}, {2.0f});
  expect_refused(dup.build(), "duplicate tensor 'x'");

  // Two tensors whose offsets share bytes.
  std::string s = header(3, 2, 0);
  for (const char* n : {"a", "b"}) {
    test::put_str(s, n);
    put<uint32_t>(s, 1);
    put<uint64_t>(s, 16);
    put<uint32_t>(s, 0);
    put<uint64_t>(s, n[0] == 'a' ? 0 : 32);
  }
  while (s.size() % 32) s += '\0';
  expect_refused(s + std::string(128, '\0'), "overlap");
}

TEST(GgufRefuse, MissingFileNamesPath) {
  try {
    GgufFile g("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos) << e.what();
  }
}

// ---- seeded fuzzing ---------------------------------------------------------------------

namespace {

enum class Outcome { Loaded, Refused, Other };

// Opens the file and reads every tensor byte and metadata value; an out-of-bounds view would
// fault here (and under ARBITER_SANITIZE it is reported precisely).
Outcome try_open(const std::string& path, std::string& why) {
  try {
    GgufFile g(path);
    uint64_t sum = 0;
    for (const Tensor& t : g.tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes(); i += 61) sum += p[i];
      if (t.nbytes()) sum += p[t.nbytes() - 1];
    }
    for (const auto& [k, v] : g.metadata()) sum += k.size() + v.as.size() + v.au.size();
    volatile uint64_t sink = sum;
    (void)sink;
    return Outcome::Loaded;
  } catch (const Error&) {
    return Outcome::Refused;
  } catch (const std::exception& e) {
    why = std::string(typeid(e).name()) + ": " + e.what();
    return Outcome::Other;
  } catch (...) {
    why = "non-std exception";
    return Outcome::Other;
  }
}

// Truncates `bytes` at each offset in `cuts`; every result must load or be refused.
void fuzz_truncations(const std::string& bytes, const std::vector<size_t>& cuts, const char* what) {
  std::string p = test::temp_dir("gguf-trunc") + "/t.gguf";
  int refused = 0;
  for (size_t cut : cuts) {
    test::write_file(p, bytes.substr(0, cut));
    std::string why;
    Outcome o = try_open(p, why);
    ASSERT_NE(o, Outcome::Other) << what << " truncated at " << cut << ": " << why;
    refused += o == Outcome::Refused;
  }
  // Every strict prefix of a file with tensors must be refused (some tensor loses bytes).
  EXPECT_EQ(refused, int(cuts.size())) << what;
}

// Overwrites 1..4 bytes (or one 8-byte field with a large value) inside [0, region) of a
// copy of `bytes`, `iters` times with a fixed seed; restores the bytes after each attempt.
void fuzz_mutations(const std::string& bytes, size_t region, int iters, uint32_t seed, const char* what) {
  std::string p = test::temp_dir("gguf-mut") + "/m.gguf";
  test::write_file(p, bytes);
  std::mt19937 rng(seed);
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  int counts[3] = {0, 0, 0};
  for (int it = 0; it < iters; ++it) {
    std::vector<std::pair<size_t, std::string>> edits;
    if (rng() % 4 == 0) {  // a length/count/offset-sized field set to an extreme value
      static const uint64_t big[] = {~uint64_t(0), uint64_t(1) << 63, uint64_t(1) << 60, 0xFFFFFFFFull,
                                     uint64_t(1) << 32, 0};
      std::string v;
      put<uint64_t>(v, big[rng() % 6]);
      edits.push_back({rng() % (region - 8), v});
    } else {
      int n = 1 + int(rng() % 4);
      for (int k = 0; k < n; ++k) edits.push_back({rng() % region, std::string(1, char(rng()))});
    }
    for (auto& [pos, v] : edits) {
      f.seekp(std::streamoff(pos));
      f.write(v.data(), std::streamsize(v.size()));
    }
    f.flush();
    std::string why;
    Outcome o = try_open(p, why);
    ++counts[int(o)];
    ASSERT_NE(o, Outcome::Other) << what << " seed " << seed << " iteration " << it << ": " << why;
    for (auto it2 = edits.rbegin(); it2 != edits.rend(); ++it2) {  // restore in reverse
      f.seekp(std::streamoff(it2->first));
      f.write(bytes.data() + it2->first, std::streamsize(it2->second.size()));
    }
    f.flush();
  }
  std::fprintf(stderr, "%s: %d mutated files loaded, %d refused\n", what, counts[0], counts[1]);
  EXPECT_GT(counts[1], iters / 10) << what << ": mutations rarely refused; are they reaching the header?";
}

}  // namespace

TEST(GgufFuzz, TruncatedSmallFileAtEveryOffset) {
  std::string b = small_writer().build();
  std::vector<size_t> cuts;
  for (size_t c = 0; c < b.size(); ++c) cuts.push_back(c);
  fuzz_truncations(b, cuts, "small");
}

TEST(GgufFuzz, TruncatedRealFile) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  std::string b = test::read_file(path);
  const size_t data_offset = 14176;
  std::vector<size_t> cuts;
  for (size_t c = 0; c < 1024; ++c) cuts.push_back(c);
  for (size_t c = 1024; c < data_offset + 64; c += 7) cuts.push_back(c);
  std::mt19937 rng(7);
  for (int k = 0; k < 48; ++k) cuts.push_back(data_offset + rng() % (b.size() - data_offset));
  cuts.push_back(b.size() - 1);
  fuzz_truncations(b, cuts, "stories260K.gguf");
}

TEST(GgufFuzz, MutatedSmallFile) {
  std::string b = small_writer().build();
  fuzz_mutations(b, b.size(), 4000, 20240601u, "small");
}

TEST(GgufFuzz, MutatedRealFileHeader) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  std::string b = test::read_file(path);
  fuzz_mutations(b, 14176 + 32, 1500, 99u, "stories260K.gguf");
}
