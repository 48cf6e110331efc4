// `arbiter info` on the shipped models, through the real CLI binary: the printed dims,
// parameter counts (rule: distinct stored tensors, see src/model/loader.cpp; TinyStories:
// 2048*128 + 2*(128 + 128*128 + 2*64*128 + 128*128 + 128 + 3*384*128) + 128 = 656,000;
// stories260K.gguf: 292,800 floats incl. its stored output copy), hashes from
// models/SHA256SUMS, the --json form, and a one-line error for a bad path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/io_test_util.h"

using namespace arbiter;

TEST(InfoCli, TinyStories656k) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto r = test::run_cli("info " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("params        656000\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("architecture  llama (family llama)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("format        hf\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dims          L=2 D=128 H=8 Hkv=4 Dh=16 F=384 V=2048 max_pos=512\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rope          theta=10000 scaling=none layout=half\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("norm_eps      1e-06\n"), std::string::npos) << r.out;
  // Tied (config.json tie_word_embeddings), then the llama family's own fields.
  EXPECT_NE(r.out.find("flags         tied_embeddings=yes qkv_bias=no qk_norm=no sliding_window=0\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("weight_dtype  bf16"), std::string::npos) << r.out;
  const std::string sha = test::published_sha("TinyStories-656K/model.safetensors");
  EXPECT_EQ(sha.size(), 64u) << "models/SHA256SUMS lists no TinyStories-656K/model.safetensors";
  EXPECT_NE(r.out.find("sha256        " + sha), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;  // nothing on stderr for a good run

  auto f = test::run_cli("info " + dir + "/fp32");
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("params        656000\n"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("weight_dtype  f32"), std::string::npos) << f.out;
}

TEST(InfoCli, Stories260kJson) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  auto r = test::run_cli("info " + path + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["arch"], "llama");
  EXPECT_EQ(j["n_params"], 292800);
  EXPECT_EQ(j["n_layer"], 5);
  EXPECT_EQ(j["d_model"], 64);
  EXPECT_EQ(j["n_head"], 8);
  EXPECT_EQ(j["n_head_kv"], 4);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["d_ff"], 172);
  EXPECT_EQ(j["vocab"], 512);
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_EQ(j["rope_layout"], "adjacent");
  EXPECT_EQ(j["qk_norm"], false);
  EXPECT_EQ(j["sliding_window"], 0);
  EXPECT_EQ(j["weight_dtype"], "f32");
  EXPECT_EQ(j["tensor_dtypes"]["f32"], 48);
  EXPECT_EQ(j["tokenizer"]["vocab"], 512);
  EXPECT_EQ(j["tokenizer"]["bos"], 1);
  EXPECT_EQ(j["tokenizer"]["eos"], 2);
  EXPECT_EQ(j["weights_sha256"], test::published_sha("stories260K/stories260K.gguf"));

  auto h = test::run_cli("info " + path);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("params        292800\n"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("layout=adjacent"), std::string::npos) << h.out;
}

TEST(InfoCli, BadPathIsOneLineError) {
  auto r = test::run_cli("info /nonexistent/model.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  auto u = test::run_cli("info");
  EXPECT_NE(u.exit_code, 0);
  auto extra = test::run_cli("info a b");
  EXPECT_NE(extra.exit_code, 0);
}
