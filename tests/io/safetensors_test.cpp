// safetensors reader: hand-built files of known values in every supported dtype, one test per
// refusal, sharded directories, the shipped TinyStories-656K files (shapes from its README;
// the F32 copy must equal the BF16 original widened), and seeded truncation / mutation runs
// where every attempt must load or throw arbiter::Error.
// Add a refusal case: expect_refused(header_json, data, "words").
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "io/io_test_util.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"

using namespace arbiter;
using test::put;
using test::safetensors_bytes;

namespace {

std::string write_tmp(const std::string& bytes) {
  std::string p = test::temp_dir("st") + "/x.safetensors";
  test::write_file(p, bytes);
  return p;
}

void expect_refused_bytes(const std::string& bytes, const std::string& words) {
  std::string p = write_tmp(bytes);
  try {
    SafetensorsSet::open_file(p);
    ADD_FAILURE() << "accepted; expected an error containing '" << words << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[safetensors] " + p), std::string::npos) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << "message: " << msg << "\nexpected: " << words;
  }
}
void expect_refused(const std::string& header, const std::string& data, const std::string& words) {
  expect_refused_bytes(safetensors_bytes(header, data), words);
}

// Data for the good file: d F64[1] 0.1, a F32[2,2] 1..4, b F16[3] 1,-2,0.5, c BF16[1,2] 1,3,
// e F32[0,4] (empty); widest first so every tensor is element-aligned.
std::string good_data() {
  std::string d;
  put<double>(d, 0.1);
  for (float f : {1.0f, 2.0f, 3.0f, 4.0f}) put<float>(d, f);
  for (uint16_t h : {0x3C00, 0xC000, 0x3800}) put<uint16_t>(d, h);
  for (uint16_t h : {0x3F80, 0x4040}) put<uint16_t>(d, h);
  return d;
}
const char* kGoodHeader =
    R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
    R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},)"
    R"("b":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},)"
    R"("c":{"dtype":"BF16","shape":[1,2],"data_offsets":[30,34]},)"
    R"("e":{"dtype":"F32","shape":[0,4],"data_offsets":[34,34]},)"
    R"("__metadata__":{"format":"pt","x":"y"}})";

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  row_to_f32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

}  // namespace

TEST(Safetensors, HandBuiltEveryDtype) {
  SafetensorsSet s = SafetensorsSet::open_file(write_tmp(safetensors_bytes(kGoodHeader, good_data())));
  EXPECT_EQ(s.tensors().size(), 5u);
  EXPECT_EQ(s.tensor("a")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s.tensor("a")->dtype, DType::F32);
  EXPECT_EQ(floats(*s.tensor("a")), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(s.tensor("b")->dtype, DType::F16);
  EXPECT_EQ(floats(*s.tensor("b")), (std::vector<float>{1, -2, 0.5}));
  EXPECT_EQ(s.tensor("c")->dtype, DType::BF16);
  EXPECT_EQ(floats(*s.tensor("c")), (std::vector<float>{1, 3}));
  EXPECT_EQ(s.tensor("d")->dtype, DType::F64);
  double d;
  row_to_f64(DType::F64, s.tensor("d")->data, &d, 1);
  EXPECT_EQ(d, 0.1);
  EXPECT_EQ(s.tensor("e")->numel(), 0);
  EXPECT_EQ(s.tensor("a")->name, "a");
  EXPECT_EQ(s.tensor("zz"), nullptr);
  EXPECT_EQ(s.metadata().at("format"), "pt");
  EXPECT_EQ(s.metadata().at("x"), "y");
  ASSERT_EQ(s.files().size(), 1u);
  // Views point into the mapping: header (8 + N bytes) then the data buffer.
  uint64_t n;
  std::memcpy(&n, s.files()[0]->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(static_cast<const uint8_t*>(s.tensor("b")->data), s.files()[0]->data() + 8 + n + 24);
}

// U8 and U32 (MLX's packed weights and fp scales) are integer tensors: read apart from the
// float ones, checked as they are (size, alignment), and written back by the writer.
TEST(Safetensors, IntegerTensorsReadAndWritten) {
  const std::string h = R"({"w":{"dtype":"U32","shape":[1,2],"data_offsets":[0,8]},)"
                        R"("s":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  const std::string data = std::string("\x10\x32\x54\x76\x98\xba\xdc\xfe", 8) + "\x01\x02\x03";
  SafetensorsSet s = SafetensorsSet::open_file(write_tmp(safetensors_bytes(h, data)));
  EXPECT_TRUE(s.tensors().empty());
  const IntTensor* w = s.int_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type, StInt::U32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(static_cast<const uint32_t*>(w->data)[1], 0xFEDCBA98u);  // little-endian words
  ASSERT_NE(s.int_tensor("s"), nullptr);
  EXPECT_EQ(s.int_tensor("s")->type, StInt::U8);
  EXPECT_EQ(static_cast<const uint8_t*>(s.int_tensor("s")->data)[2], 3);
  EXPECT_EQ(s.tensor("w"), nullptr);
  expect_refused(R"({"w":{"dtype":"U32","shape":[3],"data_offsets":[0,8]}})", data, "spans 8 bytes");

  const std::string out = test::temp_dir("st-int") + "/o.safetensors";
  write_safetensors(out, {{"w", DType::F32, w->shape, {}, w->data, StInt::U32},
                          {"s", DType::F32, {3}, {}, s.int_tensor("s")->data, StInt::U8}});
  SafetensorsSet r = SafetensorsSet::open_file(out);
  ASSERT_NE(r.int_tensor("w"), nullptr);
  EXPECT_EQ(std::memcmp(r.int_tensor("w")->data, w->data, 8), 0);
  EXPECT_EQ(r.int_tensor("s")->type, StInt::U8);
}

TEST(SafetensorsRefuse, Framing) {
  expect_refused_bytes("", "too short");
  expect_refused_bytes("1234567", "too short");
  std::string s;
  put<uint64_t>(s, 100);
  expect_refused_bytes(s + "{}", "runs past end of file");
  s.clear();
  put<uint64_t>(s, uint64_t(1) << 60);
  expect_refused_bytes(s + "{}", "100 MB");
  s.clear();
  put<uint64_t>(s, ~uint64_t(0));
  expect_refused_bytes(s + "{}", "100 MB");
}

TEST(SafetensorsRefuse, HeaderJson) {
  expect_refused("{\"a\":", "", "not valid JSON");
  expect_refused("{\"a\":1,}", "", "not valid JSON");
  expect_refused(std::string("{\"\xff\":1}"), "", "not valid JSON");  // invalid UTF-8
  expect_refused("[1,2]", "", "not a JSON object");
  expect_refused(R"({"a":3})", "", "tensor 'a' is not an object");
  expect_refused(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'), "no string 'dtype'");
  expect_refused(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0'), "no array 'shape'");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'), "data_offsets");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, '\0'), "data_offsets");
  expect_refused(R"({"__metadata__":{"k":1}})", "", "__metadata__ value of 'k' is not a string");
  expect_refused(R"({"__metadata__":[1]})", "", "__metadata__ is not an object");
}

TEST(SafetensorsRefuse, TensorEntries) {
  auto one = [](const std::string& dtype, const std::string& shape, const std::string& offs) {
    return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offs + "}}";
  };
  const std::string data(16, '\0');
  for (const char* dt : {"I32", "I8", "U16", "BOOL", "F8_E4M3", "I64", "Q8"})
    expect_refused(one(dt, "[4]", "[0,16]"), data, std::string("tensor 'w' has dtype ") + dt);
  expect_refused(one("F32", "[4]", "[0,20]"), data, "past end of file");
  expect_refused(one("F32", "[4]", "[4611686018427387904,4611686018427387920]"), data, "past end of file");
  expect_refused(one("F32", "[4]", "[18446744073709551615,18446744073709551615]"), data, "bad data_offsets");
  expect_refused(one("F32", "[4]", "[0,12]"), data, "spans 12 bytes");
  expect_refused(one("F32", "[2]", "[0,16]"), data, "spans 16 bytes");
  expect_refused(one("F32", "[4]", "[16,0]"), data, "reversed");
  expect_refused(one("F32", "[4]", "[-1,15]"), data, "bad data_offsets");
  expect_refused(one("F32", "[4]", "[0.5,16]"), data, "bad data_offsets");
  expect_refused(one("F32", "[-4]", "[0,16]"), data, "bad dimension");
  expect_refused(one("F32", "[\"4\"]", "[0,16]"), data, "bad dimension");
  expect_refused(one("F32", "[4294967296,4294967296]", "[0,16]"), data, "overflows");
  expect_refused(one("F64", "[4611686018427387904]", "[0,16]"), data, "overflows");
  expect_refused(one("F32", "[1]", "[2,6]"), data, "not aligned to its 4-byte elements");
  expect_refused(one("F64", "[1]", "[4,12]"), data, "not aligned to its 8-byte elements");
  std::string odd = one("F16", "[1]", "[0,2]");
  if (odd.size() % 2 == 0) odd += ' ';  // 8 + odd length: the data buffer starts at an odd offset
  expect_refused_bytes(safetensors_bytes(odd, data, false), "not aligned");
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 data, "overlap");
}

// ---- directories ------------------------------------------------------------------------

TEST(SafetensorsDir, SingleFileAndMissing) {
  std::string dir = test::temp_dir("stdir");
  EXPECT_THROW(SafetensorsSet::open_dir(dir), Error);
  test::write_file(dir + "/model.safetensors", safetensors_bytes(kGoodHeader, good_data()));
  SafetensorsSet s = SafetensorsSet::open_dir(dir);
  EXPECT_EQ(s.tensors().size(), 5u);
}

TEST(SafetensorsDir, ShardsLoadedOnceInSortedOrder) {
  std::string dir = test::temp_dir("stshard");
  std::string d1, d2;
  put<float>(d1, 1.5f);
  put<float>(d2, -2.5f);
  put<float>(d2, 4.0f);
  test::write_file(dir + "/model-00002-of-00002.safetensors",
                   safetensors_bytes(R"({"y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d2));
  test::write_file(dir + "/model-00001-of-00002.safetensors",
                   safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("__metadata__":{"format":"pt"}})",
                                     d1));
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"metadata":{"total_size":12},"weight_map":{"y":"model-00002-of-00002.safetensors",)"
                   R"("x":"model-00001-of-00002.safetensors"}})");
  SafetensorsSet s = SafetensorsSet::open_dir(dir);
  ASSERT_EQ(s.files().size(), 2u);
  EXPECT_EQ(s.files()[0]->path(), dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(s.files()[1]->path(), dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(floats(*s.tensor("x")), (std::vector<float>{1.5f}));
  EXPECT_EQ(floats(*s.tensor("y")), (std::vector<float>{-2.5f, 4.0f}));
  EXPECT_EQ(s.metadata().at("format"), "pt");

  // An index entry naming the wrong shard, or a path outside the folder, is refused.
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"weight_map":{"y":"model-00001-of-00002.safetensors","x":"model-00001-of-00002.safetensors"}})");
  EXPECT_THROW(SafetensorsSet::open_dir(dir), Error);
  test::write_file(dir + "/model.safetensors.index.json", R"({"weight_map":{"y":"../model-00002-of-00002.safetensors"}})");
  try {
    SafetensorsSet::open_dir(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected a file name in the same folder"), std::string::npos) << e.what();
  }
  test::write_file(dir + "/model.safetensors.index.json", R"({"weight_map":{)");
  EXPECT_THROW(SafetensorsSet::open_dir(dir), Error);
  // The same tensor in two shards.
  test::write_file(dir + "/model-00002-of-00002.safetensors",
                   safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d1));
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"weight_map":{"x":"model-00001-of-00002.safetensors","z":"model-00002-of-00002.safetensors"}})");
  try {
    SafetensorsSet::open_dir(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("also appears in an earlier file"), std::string::npos) << e.what();
  }
}

// ---- the shipped model ------------------------------------------------------------------

TEST(SafetensorsReal, TinyStoriesShapesAndF32CopyEqualsBf16) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found (models/ or ../shared/models/)";
  SafetensorsSet bf = SafetensorsSet::open_dir(dir);
  SafetensorsSet f32 = SafetensorsSet::open_dir(dir + "/fp32");
  using S = std::vector<int64_t>;
  // Shapes from the README ([out, in]); 20 tensors.
  std::map<std::string, S> want = {{"model.embed_tokens.weight", {2048, 128}}, {"model.norm.weight", {128}}};
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "input_layernorm.weight"] = {128};
    want[p + "self_attn.q_proj.weight"] = {128, 128};
    want[p + "self_attn.k_proj.weight"] = {64, 128};
    want[p + "self_attn.v_proj.weight"] = {64, 128};
    want[p + "self_attn.o_proj.weight"] = {128, 128};
    want[p + "post_attention_layernorm.weight"] = {128};
    want[p + "mlp.gate_proj.weight"] = {384, 128};
    want[p + "mlp.up_proj.weight"] = {384, 128};
    want[p + "mlp.down_proj.weight"] = {128, 384};
  }
  ASSERT_EQ(bf.tensors().size(), want.size());
  int64_t total = 0;
  for (const auto& [name, shape] : want) {
    const Tensor* t = bf.tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_EQ(t->dtype, DType::BF16) << name;
    total += t->numel();
  }
  EXPECT_EQ(total, 656000);  // README: 656,000 params
  // fp32/: the tied matrix is stored only as lm_head.weight, aliased in __metadata__.
  EXPECT_EQ(f32.tensor("model.embed_tokens.weight"), nullptr);
  ASSERT_NE(f32.tensor("lm_head.weight"), nullptr);
  EXPECT_EQ(f32.metadata().at("model.embed_tokens.weight"), "lm_head.weight");
  for (const auto& [name, shape] : want) {
    const Tensor* a = bf.tensor(name);
    const Tensor* b = f32.tensor(name == "model.embed_tokens.weight" ? "lm_head.weight" : name);
    ASSERT_NE(b, nullptr) << name;
    EXPECT_EQ(b->dtype, DType::F32);
    EXPECT_EQ(floats(*a), floats(*b)) << name;  // README: every F32 tensor is the BF16 one widened
  }
}

// ---- seeded fuzzing ---------------------------------------------------------------------

namespace {

enum class Outcome { Loaded, Refused, Other };

Outcome try_open(const std::string& path, std::string& why) {
  try {
    SafetensorsSet s = SafetensorsSet::open_file(path);
    uint64_t sum = 0;
    for (const auto& [n, t] : s.tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes(); i += 61) sum += p[i];
      if (t.nbytes()) sum += p[t.nbytes() - 1];
    }
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

void fuzz_truncations(const std::string& bytes, const std::vector<size_t>& cuts, const char* what) {
  std::string p = test::temp_dir("st-trunc") + "/t.safetensors";
  for (size_t cut : cuts) {
    test::write_file(p, bytes.substr(0, cut));
    std::string why;
    Outcome o = try_open(p, why);
    ASSERT_NE(o, Outcome::Other) << what << " truncated at " << cut << ": " << why;
    EXPECT_EQ(o, Outcome::Refused) << what << " truncated at " << cut << " was accepted";
  }
}

void fuzz_mutations(const std::string& bytes, size_t region, int iters, uint32_t seed, const char* what) {
  std::string p = test::temp_dir("st-mut") + "/m.safetensors";
  test::write_file(p, bytes);
  std::mt19937 rng(seed);
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  // JSON-significant characters make structural damage likelier than random bytes alone.
  const std::string chars = "{}[]\":,0123456789-.eE \\\xff\x80";
  int counts[3] = {0, 0, 0};
  for (int it = 0; it < iters; ++it) {
    std::vector<std::pair<size_t, char>> edits;
    int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) {
      char c = rng() % 2 ? char(rng()) : chars[rng() % chars.size()];
      edits.push_back({rng() % region, c});
    }
    for (auto& [pos, c] : edits) {
      f.seekp(std::streamoff(pos));
      f.put(c);
    }
    f.flush();
    std::string why;
    Outcome o = try_open(p, why);
    ++counts[int(o)];
    ASSERT_NE(o, Outcome::Other) << what << " seed " << seed << " iteration " << it << ": " << why;
    for (auto e = edits.rbegin(); e != edits.rend(); ++e) {
      f.seekp(std::streamoff(e->first));
      f.put(bytes[e->first]);
    }
    f.flush();
  }
  std::fprintf(stderr, "%s: %d mutated files loaded, %d refused\n", what, counts[0], counts[1]);
  EXPECT_GT(counts[1], iters / 10) << what;
}

}  // namespace

TEST(SafetensorsFuzz, TruncatedHandBuiltAtEveryOffset) {
  std::string b = safetensors_bytes(kGoodHeader, good_data());
  std::vector<size_t> cuts;
  for (size_t c = 0; c < b.size(); ++c) cuts.push_back(c);
  fuzz_truncations(b, cuts, "hand-built");
}

TEST(SafetensorsFuzz, TruncatedTinyStories) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  std::string b = test::read_file(dir + "/model.safetensors");
  std::vector<size_t> cuts;
  for (size_t c = 0; c < 2200; ++c) cuts.push_back(c);
  std::mt19937 rng(3);
  for (int k = 0; k < 32; ++k) cuts.push_back(2200 + rng() % (b.size() - 2200));
  cuts.push_back(b.size() - 1);
  fuzz_truncations(b, cuts, "TinyStories model.safetensors");
}

TEST(SafetensorsFuzz, MutatedHandBuilt) {
  std::string b = safetensors_bytes(kGoodHeader, good_data());
  fuzz_mutations(b, b.size(), 4000, 11u, "hand-built");
}

TEST(SafetensorsFuzz, MutatedTinyStoriesHeader) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  std::string b = test::read_file(dir + "/fp32/model.safetensors");
  fuzz_mutations(b, 8 + 2160, 3000, 5u, "TinyStories fp32 model.safetensors");
}
