// SHA-256 per FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 6.2). Two compression paths:
// a portable one, and one using the x86 SHA extensions (SHA-NI), chosen at run time,
// because model weights of several GB are hashed at every load and the portable path
// runs at a few hundred MB/s. Tests run both paths on the NIST vectors.
#include "io/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/file.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ARB_SHA_X86 1
#endif

namespace arbiter {

namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes (4.2.2).
alignas(16) const uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

// Initial hash value H(0) (5.3.3).
const uint32_t kH0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress_portable(uint32_t h[8], const uint8_t* p, size_t n_blocks) {
  for (; n_blocks > 0; --n_blocks, p += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(p[4 * t]) << 24 | uint32_t(p[4 * t + 1]) << 16 |
             uint32_t(p[4 * t + 2]) << 8 | uint32_t(p[4 * t + 3]);
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = hh + S1 + ch + kK[t] + w[t];
      uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      uint32_t t2 = S0 + maj;
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
}

#ifdef ARB_SHA_X86
// SHA-NI: sha256rnds2 does two rounds on state held as (ABEF, CDGH); sha256msg1/msg2
// compute the message schedule four words at a time (Intel SHA extensions reference).
__attribute__((target("sha,sse4.1,ssse3"))) void compress_shani(uint32_t h[8], const uint8_t* p,
                                                               size_t n_blocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));   // A B C D
  __m128i st1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));   // E F G H
  tmp = _mm_shuffle_epi32(tmp, 0xB1);
  st1 = _mm_shuffle_epi32(st1, 0x1B);
  __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);  // ABEF
  st1 = _mm_blend_epi16(st1, tmp, 0xF0);       // CDGH
  for (; n_blocks > 0; --n_blocks, p += 64) {
    const __m128i save0 = st0, save1 = st1;
    __m128i m[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      __m128i w;
      if (g < 4) {
        w = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), bswap);
      } else {
        // W[t..t+3] = sigma1(W[t-2]) + W[t-7] + sigma0(W[t-15]) + W[t-16]
        __m128i x = _mm_sha256msg1_epu32(m[g & 3], m[(g + 1) & 3]);
        x = _mm_add_epi32(x, _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4));
        w = _mm_sha256msg2_epu32(x, m[(g + 3) & 3]);
      }
      m[g & 3] = w;
      __m128i k = _mm_add_epi32(w, _mm_load_si128(reinterpret_cast<const __m128i*>(&kK[4 * g])));
      st1 = _mm_sha256rnds2_epu32(st1, st0, k);
      k = _mm_shuffle_epi32(k, 0x0E);
      st0 = _mm_sha256rnds2_epu32(st0, st1, k);
    }
    st0 = _mm_add_epi32(st0, save0);
    st1 = _mm_add_epi32(st1, save1);
  }
  tmp = _mm_shuffle_epi32(st0, 0x1B);        // FEBA
  st1 = _mm_shuffle_epi32(st1, 0xB1);        // DCHG
  st0 = _mm_blend_epi16(tmp, st1, 0xF0);     // DCBA
  st1 = _mm_alignr_epi8(st1, tmp, 8);        // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), st0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), st1);
}
#endif

}  // namespace

bool Sha256::hw_available() {
#ifdef ARB_SHA_X86
  // CPUID directly: clang 14's __builtin_cpu_supports does not know "sha" (the fuzz build).
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA) != 0;
  }();
  return ok;
#else
  return false;
#endif
}

Sha256::Sha256() : Sha256(true) {}

Sha256::Sha256(bool allow_hw) : hw_(allow_hw && hw_available()) {
  std::memcpy(h_, kH0, sizeof(h_));
}

void Sha256::blocks(const uint8_t* p, size_t n_blocks) {
#ifdef ARB_SHA_X86
  if (hw_) {
    compress_shani(h_, p, n_blocks);
    return;
  }
#endif
  compress_portable(h_, p, n_blocks);
}

void Sha256::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (buf_len_ > 0) {
    size_t take = std::min(n, 64 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    n -= take;
    if (buf_len_ < 64) return;
    blocks(buf_, 1);
    buf_len_ = 0;
  }
  size_t full = n / 64;
  if (full > 0) blocks(p, full);
  p += full * 64;
  n -= full * 64;
  if (n > 0) std::memcpy(buf_, p, n);
  buf_len_ = n;
}

std::array<uint8_t, 32> Sha256::digest() {
  // Padding (5.1.1): a 1 bit, zeros to 56 mod 64 bytes, then the bit length big-endian.
  uint64_t bits = total_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buf_len_ < 56) ? 56 - buf_len_ : 120 - buf_len_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = uint8_t(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = uint8_t(h_[i] >> (24 - 8 * j));
  return out;
}

std::string Sha256::hex_digest() {
  static const char* hex = "0123456789abcdef";
  auto d = digest();
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
