// synth's seeded normal streams (synth.h: synth_normals, synth_stream_key).
//
// Element i of stream `key` is one value of Box-Muller applied to pair i / 2's 64-bit
// SplitMix64 draw; log, sin and cos are evaluated here with IEEE +, *, /, sqrt and explicit
// fma only, so no libm can change a byte. The pairs are computed in batches by one loop with
// no branches or calls (the quadrant is a select, frexp is bit arithmetic), which the
// compiler vectorises: the same operations on each lane, so every value is the one a scalar
// evaluation gives (SynthNormals.BatchedIsElementwise), at several GB/s per core instead of
// ~100 MB/s. This file is compiled with -fno-math-errno (sqrt then needs no errno branch,
// which would stop vectorisation; its argument is never negative) and -ffp-contract=off (no
// multiply-add the source does not spell as fma: a vectorised and a scalar copy of the loop
// must round alike), src/CMakeLists.txt.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "model/synth.h"

namespace arbiter {

namespace {

uint64_t mix64(uint64_t x) {  // SplitMix64's finalizer (Steele, Lea, Flood 2014)
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr double kLn2 = 0.6931471805599453094;
constexpr double kHalfPi = 1.5707963267948966192;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // the counter's stride between pairs

// 1 / n! as a compile-time constant (each step an IEEE division, the same everywhere).
constexpr double inv_fact(int n) {
  double r = 1.0;
  for (int i = 2; i <= n; ++i) r /= i;
  return r;
}

// log(x) for x in [2^-32, 1]: x = m 2^e with m in [1/sqrt2, sqrt2), log m = 2 atanh(t),
// t = (m - 1) / (m + 1), |t| <= 0.172; the atanh series to t^23 is below 1e-17. m and e are
// frexp's, taken from the bits (x is normal and positive), then m doubled below 1/sqrt2.
inline double det_log(double x) {
  const uint64_t b = std::bit_cast<uint64_t>(x);
  int e = int(b >> 52) - 1022;
  double m = std::bit_cast<double>((b & 0x000fffffffffffffull) | 0x3fe0000000000000ull);  // [0.5, 1)
  const bool low = m < 0.70710678118654752;
  m = low ? m * 2 : m;  // exact
  e = low ? e - 1 : e;
  const double t = (m - 1) / (m + 1);
  const double t2 = t * t;
  constexpr double kInvOdd[12] = {1.0,      1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11,
                                  1.0 / 13, 1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23};
  double p = kInvOdd[11];
#pragma GCC unroll 12
  for (int k = 10; k >= 0; --k) p = std::fma(p, t2, kInvOdd[k]);
  return std::fma(2 * t, p, double(e) * kLn2);
}

// Taylor coefficients (-1)^k / (2k+1)! and (-1)^k / (2k)!, k = 0..11, fixed at compile time.
struct SinCosCoeffs {
  double s[12], c[12];
};
constexpr SinCosCoeffs make_sincos_coeffs() {
  SinCosCoeffs t{};
  for (int k = 0; k < 12; ++k) {
    const double sgn = (k % 2) ? -1.0 : 1.0;
    t.s[k] = sgn * inv_fact(2 * k + 1);
    t.c[k] = sgn * inv_fact(2 * k);
  }
  return t;
}
constexpr SinCosCoeffs kSinCos = make_sincos_coeffs();

// sin and cos of a in [0, pi/2) by Taylor series (terms to a^23 / 23!, error < 1e-17).
inline void det_sincos(double a, double& s, double& c) {
  const double a2 = a * a;
  double ps = kSinCos.s[11], pc = kSinCos.c[11];
#pragma GCC unroll 12
  for (int k = 10; k >= 0; --k) {
    ps = std::fma(ps, a2, kSinCos.s[k]);
    pc = std::fma(pc, a2, kSinCos.c[k]);
  }
  s = a * ps;
  c = pc;
}

// The two N(0, 1) values of pairs p0 .. p0 + n - 1 (Box-Muller on each pair's draw): the high
// 32 bits give the radius, the low 32 the angle 2 pi u2, whose top two bits pick the
// quadrant and the other 30 the angle inside it.
void box_muller_pairs(uint64_t key, int64_t p0, int n, double* z0, double* z1) {
  for (int j = 0; j < n; ++j) {
    const uint64_t r = mix64(key + uint64_t(p0 + j) * kGolden);
    const uint32_t hi = uint32_t(r >> 32), lo = uint32_t(r);
    const double u1 = (double(hi) + 1.0) * 0x1p-32;  // (0, 1]: log is finite
    const double rad = std::sqrt(-2.0 * det_log(u1));
    const double a = double(lo & 0x3fffffffu) * 0x1p-30 * kHalfPi;
    double s, c;
    det_sincos(a, s, c);
    // Quadrant q: (z0, z1) = (c, s), (-s, c), (-c, -s), (s, -c).
    const uint32_t q = lo >> 30;
    const bool swap = q & 1;
    const double b0 = swap ? s : c, b1 = swap ? c : s;
    z0[j] = ((q == 1 || q == 2) ? -b0 : b0) * rad;
    z1[j] = (q >= 2 ? -b1 : b1) * rad;
  }
}

}  // namespace

uint64_t synth_stream_key(const std::string& name, uint64_t seed) { return mix64(seed ^ mix64(fnv1a(name))); }

void synth_normals(uint64_t key, int64_t begin, int64_t n, double std, float* out) {
  constexpr int kBatch = 128;  // pairs per batch: the buffers stay in L1
  double z0[kBatch], z1[kBatch];
  int64_t i = begin;
  const int64_t end = begin + n;
  if (i < end && i % 2 != 0) {  // an odd start: the second value of its pair
    box_muller_pairs(key, i / 2, 1, z0, z1);
    out[0] = float(std * z1[0]);
    ++i;
  }
  while (i < end) {
    const int64_t pairs = std::min<int64_t>(kBatch, (end - i + 1) / 2);  // the last may be half used
    box_muller_pairs(key, i / 2, int(pairs), z0, z1);
    float* o = out + (i - begin);
    const int64_t m = std::min(end - i, 2 * pairs);
    for (int64_t k = 0; k < m; ++k) o[k] = float(std * ((k % 2) ? z1[k / 2] : z0[k / 2]));
    i += m;
  }
}

}  // namespace arbiter
