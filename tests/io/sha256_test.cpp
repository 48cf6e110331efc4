// SHA-256 (io/sha256.h, OpenSSL EVP underneath) against the FIPS 180-2 / NIST example
// vectors, with incremental updates split at every padding boundary, against a published
// file hash (models/SHA256SUMS), and the streaming file hash's progress callback.
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

std::string hash(const std::string& m) {
  Sha256 h;
  h.update(m.data(), m.size());
  return h.hex_digest();
}

}  // namespace

TEST(Sha256, NistVectors) {
  for (const Vector& v : kVectors) EXPECT_EQ(hash(v.msg), v.hex) << "len=" << v.msg.size();
  EXPECT_EQ(sha256_hex("abc", 3), kVectors[0].hex);
}

TEST(Sha256, MillionAsInOddPieces) {
  const Vector& v = kVectors[4];
  Sha256 h;
  size_t pos = 0, step = 1;
  while (pos < v.msg.size()) {
    size_t n = std::min(step, v.msg.size() - pos);
    h.update(v.msg.data() + pos, n);
    pos += n;
    step = step * 3 % 1013 + 1;  // 1..1013 bytes, crossing block edges at every offset
  }
  EXPECT_EQ(h.hex_digest(), v.hex);
}

TEST(Sha256, SplitUpdatesAgreeOnEveryLengthAroundPadding) {
  // Lengths 0..300 cover 55/56/63/64/119/120 (where the length field spills a block).
  std::mt19937 rng(1234);
  std::string m(300, '\0');
  for (char& c : m) c = char(rng());
  for (size_t n = 0; n <= m.size(); ++n) {
    const std::string whole = hash(m.substr(0, n));
    Sha256 bytes;  // one byte per update
    for (size_t i = 0; i < n; ++i) bytes.update(m.data() + i, 1);
    EXPECT_EQ(bytes.hex_digest(), whole) << "len=" << n;
    if (n % 61 != 0) continue;  // split in two at every point for one length per block class
    for (size_t cut = 0; cut <= n; ++cut) {
      Sha256 h;
      h.update(m.data(), cut);
      h.update(m.data() + cut, n - cut);
      EXPECT_EQ(h.hex_digest(), whole) << "len=" << n << " cut=" << cut;
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
  // The progress callback sees every byte once, in pieces of at most 1 MiB.
  uint64_t seen = 0, pieces = 0;
  EXPECT_EQ(sha256_file(gguf, [&](uint64_t n) { seen += n, ++pieces; }), want);
  std::ifstream g(gguf, std::ios::binary | std::ios::ate);
  EXPECT_EQ(seen, uint64_t(g.tellg()));
  EXPECT_EQ(pieces, (seen + (1u << 20) - 1) >> 20);
}

TEST(Sha256, MissingFileIsAnError) {
  try {
    sha256_file("/nonexistent/arbiter-file");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/arbiter-file"), std::string::npos) << e.what();
  }
}
