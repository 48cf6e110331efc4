// SHA-256 against the FIPS 180-2 / NIST example vectors, on both compression paths
// (portable and SHA-NI when the CPU has it), with incremental updates split at every
// padding boundary, and against a published file hash (models/SHA256SUMS).
// Add a case: append {message, expected hex} to kVectors.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "io/io_test_util.h"
#include "io/sha256.h"

using namespace arbiter;

namespace {

struct Vector {
  std::string msg, hex;
};
const Vector kVectors[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",  // 448 bits
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
     "mnopqrstnopqrstu",  // 896 bits
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
};

std::vector<bool> paths() {
  std::vector<bool> p = {false};
  if (Sha256::hw_available()) p.push_back(true);
  return p;
}

std::string hash(const std::string& m, bool hw) {
  Sha256 h(hw);
  h.update(m.data(), m.size());
  return h.hex_digest();
}

}  // namespace

TEST(Sha256, NistVectorsBothPaths) {
  if (!Sha256::hw_available()) std::fprintf(stderr, "note: no SHA-NI on this CPU; portable path only\n");
  for (bool hw : paths())
    for (const Vector& v : kVectors)
      EXPECT_EQ(hash(v.msg, hw), v.hex) << "hw=" << hw << " len=" << v.msg.size();
  EXPECT_EQ(sha256_hex("abc", 3), kVectors[0].hex);
}

TEST(Sha256, MillionAsInOddPieces) {
  const Vector& v = kVectors[4];
  for (bool hw : paths()) {
    Sha256 h(hw);
    size_t pos = 0, step = 1;
    while (pos < v.msg.size()) {
      size_t n = std::min(step, v.msg.size() - pos);
      h.update(v.msg.data() + pos, n);
      pos += n;
      step = step * 3 % 1013 + 1;  // 1..1013 bytes, crossing block edges at every offset
    }
    EXPECT_EQ(h.hex_digest(), v.hex) << "hw=" << hw;
  }
}

TEST(Sha256, PathsAgreeOnEveryLengthAroundPadding) {
  // Lengths 0..300 cover 55/56/63/64/119/120 (where the length field spills a block).
  std::mt19937 rng(1234);
  std::string m(300, '\0');
  for (char& c : m) c = char(rng());
  for (size_t n = 0; n <= m.size(); ++n) {
    std::string portable = hash(m.substr(0, n), false);
    for (bool hw : paths()) EXPECT_EQ(hash(m.substr(0, n), hw), portable) << "len=" << n;
    // split in two at every point for one length per block class
    if (n % 61 == 0)
      for (size_t cut = 0; cut <= n; ++cut) {
        Sha256 h(false);
        h.update(m.data(), cut);
        h.update(m.data() + cut, n - cut);
        EXPECT_EQ(h.hex_digest(), portable) << "len=" << n << " cut=" << cut;
      }
  }
}

TEST(Sha256, FileMatchesPublishedSum) {
  std::string gguf = test::stories260k_gguf();
  std::string sums = test::shared_path("models/SHA256SUMS");
  if (gguf.empty() || sums.empty()) GTEST_SKIP() << "stories260K.gguf or models/SHA256SUMS not found";
  std::ifstream f(sums);
  std::string line, want;
  while (std::getline(f, line))
    if (line.find("stories260K/stories260K.gguf") != std::string::npos) want = line.substr(0, 64);
  ASSERT_EQ(want.size(), 64u);
  EXPECT_EQ(sha256_file(gguf), want);
}

TEST(Sha256, MissingFileIsAnError) {
  try {
    sha256_file("/nonexistent/arbiter-file");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/arbiter-file"), std::string::npos) << e.what();
  }
}
