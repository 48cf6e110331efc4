#include "io/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "io/file.h"

namespace arbiter {

// OpenSSL fails these calls only on allocation failure or a broken library: invariants here.
struct Sha256::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  Ctx() {
    ARB_ASSERT(md != nullptr);
    ARB_ASSERT(EVP_DigestInit_ex(md, EVP_sha256(), nullptr) == 1);
  }
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, size_t n) {
  if (n > 0) ARB_ASSERT(EVP_DigestUpdate(ctx_->md, data, n) == 1);
}

std::array<uint8_t, 32> Sha256::digest() {
  std::array<uint8_t, 32> out;
  unsigned len = 0;
  ARB_ASSERT(EVP_DigestFinal_ex(ctx_->md, out.data(), &len) == 1 && len == out.size());
  return out;
}

std::string Sha256::hex_digest() {
  static const char* hex = "0123456789abcdef";
  const auto d = digest();
  std::string s(64, '0');
  for (int i = 0; i < 32; ++i) {
    s[2 * i] = hex[d[i] >> 4];
    s[2 * i + 1] = hex[d[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex_digest();
}

std::string sha256_file(const std::string& path, const std::function<void(uint64_t)>& on_read) {
  InputFile f(path, "[sha256]");
  Sha256 h;
  std::vector<uint8_t> buf(1 << 20);
  for (uint64_t at = 0; at < f.size(); at += buf.size()) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), f.size() - at));
    f.read_at(at, buf.data(), n);
    h.update(buf.data(), n);
    if (on_read) on_read(n);
  }
  return h.hex_digest();
}

}  // namespace arbiter
