// llama.cpp's tokenizer test vectors (tests/test-tokenizer-0): for each vocab-only GGUF,
// every .inp string must encode (no BOS, no special parsing) to exactly the .out ids,
// which HF tokenizers produced. One TEST per vocabulary so a failure names it; each prints
// its pass count. Also: decode(encode(x)) == x on the same strings, and the refusal of
// vocabulary types that are not implemented (bert/WordPiece).
// To add a vocabulary: add its name to the VOCAB_TEST list below.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_fixture.h"

namespace arbiter {
namespace {

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

void run_vectors(const std::string& name) {
  std::string why;
  std::string path = test::vocab_gguf(name, true, &why);
  if (path.empty()) GTEST_SKIP() << why;
  GgufFile g(path);
  std::unique_ptr<Tokenizer> tok = tokenizer_from_gguf(g);
  test::VocabVectors v = test::read_vocab_vectors(path);
  ASSERT_EQ(v.inputs.size(), 46u) << "llama.cpp's vector files hold 46 strings";
  ASSERT_EQ(v.inputs.size(), v.expected.size());
  size_t pass = 0, round_trip = 0;
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    std::vector<int32_t> got = tok->encode(v.inputs[i], /*add_special=*/false, /*parse_special=*/false);
    if (got == v.expected[i])
      ++pass;
    else
      ADD_FAILURE() << name << " string " << i << " \"" << v.inputs[i]
                    << "\"\n  expected: " << ids_str(v.expected[i]) << "\n  got:      " << ids_str(got);
    std::string back = tok->decode(v.expected[i], /*skip_special=*/true);
    if (back == v.inputs[i])
      ++round_trip;
    else
      ADD_FAILURE() << name << " string " << i << " decodes to \"" << back << "\"";
  }
  std::printf("[ vectors  ] %s: %zu/%zu encoded exactly, %zu/%zu round trips (%s)\n", name.c_str(), pass,
              v.inputs.size(), round_trip, v.inputs.size(), tok->kind().c_str());
}

#define VOCAB_TEST(test_name, file) \
  TEST(VocabVectors, test_name) { run_vectors(file); }

VOCAB_TEST(LlamaSpm, "ggml-vocab-llama-spm")
VOCAB_TEST(Phi3, "ggml-vocab-phi-3")
VOCAB_TEST(Gpt2, "ggml-vocab-gpt-2")
VOCAB_TEST(Mpt, "ggml-vocab-mpt")
VOCAB_TEST(Falcon, "ggml-vocab-falcon")
VOCAB_TEST(Starcoder, "ggml-vocab-starcoder")
VOCAB_TEST(Refact, "ggml-vocab-refact")
VOCAB_TEST(DeepseekCoder, "ggml-vocab-deepseek-coder")
VOCAB_TEST(DeepseekLlm, "ggml-vocab-deepseek-llm")

TEST(VocabVectors, BertIsRefusedByName) {
  std::string why;
  std::string path = test::vocab_gguf("ggml-vocab-bert-bge", false, &why);
  if (path.empty()) GTEST_SKIP() << why;
  GgufFile g(path);
  try {
    tokenizer_from_gguf(g);
    FAIL() << "a WordPiece vocabulary must be refused";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[tokenizer] "), std::string::npos) << msg;
    EXPECT_NE(
        msg.find(
            "ggml-vocab-bert-bge.gguf: tokenizer model 'bert' is not supported (supported: llama, gpt2)"),
        std::string::npos)
        << msg;
  }
}

// The metadata llama.cpp's README lists for these files: specials and policies.
TEST(VocabVectors, SpecialIdsAndBosPolicy) {
  std::string why;
  std::string spm = test::vocab_gguf("ggml-vocab-llama-spm", false, &why);
  if (spm.empty()) GTEST_SKIP() << why;
  GgufFile g1(spm);
  auto t1 = tokenizer_from_gguf(g1);
  EXPECT_EQ(t1->vocab_size(), 32000);
  EXPECT_EQ(t1->bos_id(), 1);
  EXPECT_EQ(t1->eos_id(), 2);
  EXPECT_TRUE(t1->add_bos());
  EXPECT_EQ(t1->encode("Hello world", true, false), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_TRUE(t1->is_special(1));
  EXPECT_FALSE(t1->is_special(15043));
  // "<s>" as text is three ordinary pieces unless specials are parsed.
  EXPECT_EQ(t1->encode("<s>", false, true), (std::vector<int32_t>{1}));
  EXPECT_NE(t1->encode("<s>", false, false), (std::vector<int32_t>{1}));

  std::string gpt2 = test::vocab_gguf("ggml-vocab-gpt-2", false, &why);
  GgufFile g2(gpt2);
  auto t2 = tokenizer_from_gguf(g2);
  EXPECT_EQ(t2->vocab_size(), 50257);
  EXPECT_EQ(t2->bos_id(), 50256);
  EXPECT_EQ(t2->eos_id(), 50256);
  EXPECT_FALSE(t2->add_bos()) << "gpt2 vocabularies add no BOS unless add_bos_token says so";
  EXPECT_EQ(t2->encode("Hello world<|endoftext|>", true, true), (std::vector<int32_t>{15496, 995, 50256}));
  EXPECT_EQ(t2->decode({15496, 995, 50256}, true), "Hello world");
  EXPECT_EQ(t2->decode({15496, 995, 50256}, false), "Hello world<|endoftext|>");

  std::string ds = test::vocab_gguf("ggml-vocab-deepseek-coder", false, &why);
  GgufFile g3(ds);
  auto t3 = tokenizer_from_gguf(g3);
  EXPECT_TRUE(t3->add_bos()) << "deepseek-coder sets tokenizer.ggml.add_bos_token = true";
  EXPECT_EQ(t3->encode("", true, false), (std::vector<int32_t>{32013}));
}

// A vocab-only GGUF (0 tensors) through the CLI.
TEST(VocabVectors, CliTokenizeVocabOnlyGguf) {
  std::string why;
  std::string path = test::vocab_gguf("ggml-vocab-gpt-2", false, &why);
  if (path.empty()) GTEST_SKIP() << why;
  auto r = test::run_cli("tokenize -m '" + path + "' 'Hello world'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995\n");
  std::string bert = test::vocab_gguf("ggml-vocab-bert-bge", false, &why);
  auto rb = test::run_cli("tokenize -m '" + bert + "' 'Hello'");
  EXPECT_EQ(rb.exit_code, 1);
  EXPECT_EQ(rb.out, "");
  EXPECT_NE(rb.err.find("tokenizer model 'bert' is not supported (supported: llama, gpt2)"),
            std::string::npos)
      << rb.err;
}

}  // namespace
}  // namespace arbiter
