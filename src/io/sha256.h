// SHA-256 (FIPS 180-4) for weight, corpus and trace hashes, through OpenSSL's EVP interface
// (libcrypto), which picks the CPU's SHA extensions at run time. Until this change arbiter
// carried its own implementation; docs/performance.md §SHA-256 has the measurement of both.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace arbiter {

/// A streaming hash: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated after
  std::string hex_digest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(const void* data, size_t n);
/// Hash of a file's bytes; throws arbiter::Error naming the path if it cannot be read.
/// on_read, when given, gets the size of each piece hashed (progress of a long hash).
std::string sha256_file(const std::string& path, const std::function<void(uint64_t)>& on_read = {});

}  // namespace arbiter
