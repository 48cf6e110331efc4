// SHA-256 (FIPS 180-4), our own implementation, used for weight, corpus and trace hashes.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace arbiter {

class Sha256 {
 public:
  /// Uses the x86 SHA extensions when the CPU has them (checked at run time).
  Sha256();
  /// allow_hw=false forces the portable path (tests check both paths).
  explicit Sha256(bool allow_hw);
  /// Whether this CPU can run the SHA-extension path.
  static bool hw_available();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated after
  std::string hex_digest();

 private:
  void blocks(const uint8_t* p, size_t n_blocks);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
  bool hw_ = false;
};

std::string sha256_hex(const void* data, size_t n);
/// Hash of a file's bytes; throws arbiter::Error naming the path if it cannot be read.
/// on_read, when given, gets the size of each piece hashed (progress of a long hash).
std::string sha256_file(const std::string& path, const std::function<void(uint64_t)>& on_read = {});

}  // namespace arbiter
