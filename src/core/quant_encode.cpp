// Encoders of ggml's block formats. Those llama-quantize uses without an imatrix (Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K, MXFP4) follow ggml-quants.c's
// quantize_row_*_ref step by step in float, in the same operation order, so that their blocks
// can be byte-identical with llama-quantize's: the scale searches make_qkx2_quants (Q2_K,
// Q4_K, Q5_K) and make_qx_quants (Q6_K), the 6-bit scale packing, nearest_int's rounding.
// This file is compiled with -ffp-contract=off (src/CMakeLists.txt): a fused multiply-add
// rounds once where ggml's reference rounds twice, which flips near-tie quants.
//
// Q3_K, IQ4_NL and IQ4_XS get plain round-to-nearest encoders of our own (a scale from the
// largest magnitude, each value to its nearest code): valid blocks for tests, not
// llama.cpp's search, and `arbiter quantize` does not offer them.
//
// MLX's formats: mlx_affine_quantize_group is MLX's affine quantizer (what `arbiter quantize
// --mlx` writes); the MLX_* block encoders serve tests.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/quant.h"

namespace arbiter {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml-quants.c GROUP_MAX_EPS

// Round to nearest, ties to even, through the float adder (ggml's nearest_int; |x| < 2^22).
int nearest_int(float x) {
  const float v = x + 12582912.f;
  int i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

uint16_t h(float x) { return f32_to_f16(x); }
float hf(uint16_t x) { return f16_to_f32(x); }

template <class B>
void store(uint8_t* dst, const B& b) { std::memcpy(dst, &b, sizeof(B)); }

// Largest magnitude of x[0, n) and the signed value holding it (the first one on ties).
void signed_max(const float* x, int n, float& amax, float& max) {
  amax = 0;
  max = 0;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
}

void encode_q8_0(const float* x, uint8_t* dst) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  BlockQ8_0 b;
  b.d = h(d);
  for (int j = 0; j < 32; ++j) b.qs[j] = int8_t(std::round(x[j] * id));
  store(dst, b);
}

// q[32] -> qs nibbles (value j low nibble of byte j, value j + 16 the high one) and qh bits.
void pack_q4_5(const uint8_t* q, uint8_t* dst, bool five, uint16_t d, uint16_t m, bool with_min);

// Q4_0 / Q5_0: d = signed max / -2^(bits-1), q = trunc(x / d + 2^(bits-1) + 0.5), at most
// 2^bits - 1. The 5th bits go to qh: value j to bit j.
void encode_q4_5_0(const float* x, uint8_t* dst, bool five) {
  float amax, max;
  signed_max(x, 32, amax, max);
  const float half = five ? 16.f : 8.f;
  const float d = max / -half;
  const float id = d ? 1.0f / d : 0.0f;
  const int top = five ? 31 : 15;
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(std::min(top, int(int8_t(x[j] * id + (half + 0.5f)))));
  pack_q4_5(q, dst, five, h(d), 0, false);
}

void encode_q4_5_1(const float* x, uint8_t* dst, bool five) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / (five ? 31 : 15);
  const float id = d ? 1.0f / d : 0.0f;
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) {
    const float v = (x[j] - min) * id + 0.5f;
    q[j] = five ? uint8_t(v) : uint8_t(std::min(15, int(int8_t(v))));
  }
  pack_q4_5(q, dst, five, h(d), h(min), true);
}

void pack_q4_5(const uint8_t* q, uint8_t* dst, bool five, uint16_t d, uint16_t m, bool with_min) {
  uint8_t qs[16];
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
    qh |= uint32_t(q[j] >> 4 & 1) << j | uint32_t(q[j + 16] >> 4 & 1) << (j + 16);
  }
  size_t at = 0;
  std::memcpy(dst + at, &d, 2);
  at += 2;
  if (with_min) {
    std::memcpy(dst + at, &m, 2);
    at += 2;
  }
  if (five) {
    std::memcpy(dst + at, &qh, 4);
    at += 4;
  }
  std::memcpy(dst + at, qs, 16);
}

// ggml's make_qkx2_quants: x ~ scale * L + min with L in [0, nmax], min <= 0, searching
// nstep + 1 scales around nmax / (max - min) for the least weighted error. Returns the scale
// and -min in the_min.
float make_qkx2(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, float rmin,
                float rdelta, int nstep, bool use_mad) {
  uint8_t Laux[32];
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += w[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = uint8_t(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += w[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type 1 and no weights (Q6_K): x ~ scale * (L - nmax),
// trying 19 scales around -nmax / (signed max), weights x^2. Returns the scale.
float make_qx(int n, int nmax, const float* x, int8_t* L) {
  float amax, max;
  signed_max(x, n, amax, max);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void encode_q2_k(const float* x, uint8_t* dst) {
  BlockQ2_K b{};
  uint8_t L[256];
  float w[16], mins[16], scales[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  if (max_scale > 0) {
    const float iscale = 15.f / max_scale;
    for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(nearest_int(iscale * scales[j]));
    b.d = h(max_scale / 15.f);
  }
  if (max_min > 0) {
    const float iscale = 15.f / max_min;
    for (int j = 0; j < 16; ++j) b.scales[j] |= uint8_t(nearest_int(iscale * mins[j]) << 4);
    b.dmin = h(max_min / 15.f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = hf(b.d) * (b.scales[j] & 0xF);
    if (!d) continue;
    const float dm = hf(b.dmin) * (b.scales[j] >> 4);
    for (int i = 0; i < 16; ++i) L[16 * j + i] = uint8_t(std::max(0, std::min(3, nearest_int((x[16 * j + i] + dm) / d))));
  }
  for (int n = 0; n < 256; n += 128)
    for (int l = 0; l < 32; ++l)
      b.qs[n / 4 + l] = uint8_t(L[n + l] | L[n + l + 32] << 2 | L[n + l + 64] << 4 | L[n + l + 96] << 6);
  store(dst, b);
}

// Q4_K / Q5_K: per sub-block of 32 a make_qkx2 fit (weights av_x + |x|), then the 8 scales
// and 8 mins as 6-bit multiples of d = max scale / 63 and dmin = max min / 63, then each
// quant again against the stored scale and min.
void encode_q45_k(const float* x, uint8_t* dst, bool five) {
  const int nmax = five ? 31 : 15;
  uint8_t L[256];
  float w[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], five ? -0.5f : -1.f, 0.1f,
                          five ? 15 : 20, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  uint8_t sb[12] = {};
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      sb[j] = ls;
      sb[j + 4] = lm;
    } else {
      sb[j + 4] = uint8_t((ls & 0xF) | (lm & 0xF) << 4);
      sb[j - 4] |= uint8_t((ls >> 4) << 6);
      sb[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  const uint16_t d = h(max_scale / 63.f), dmin = h(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, sb, sc, m);
    const float dl = hf(d) * sc;
    if (!dl) continue;
    const float dm = hf(dmin) * m;
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(std::max(0, std::min(nmax, nearest_int((x[32 * j + i] + dm) / dl))));
  }
  if (five) {
    BlockQ5_K b{};
    b.d = d;
    b.dmin = dmin;
    std::memcpy(b.scales, sb, 12);
    for (int n = 0; n < 4; ++n)  // sub-blocks 2n (low nibbles, qh bit 2n) and 2n + 1
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[64 * n + l], l2 = L[64 * n + 32 + l];
        b.qs[32 * n + l] = uint8_t((l1 & 0xF) | (l2 & 0xF) << 4);
        b.qh[l] |= uint8_t((l1 >> 4) << (2 * n) | (l2 >> 4) << (2 * n + 1));
      }
    store(dst, b);
  } else {
    BlockQ4_K b{};
    b.d = d;
    b.dmin = dmin;
    std::memcpy(b.scales, sb, 12);
    for (int n = 0; n < 4; ++n)
      for (int l = 0; l < 32; ++l) b.qs[32 * n + l] = uint8_t(L[64 * n + l] | L[64 * n + 32 + l] << 4);
    store(dst, b);
  }
}

void encode_q6_k(const float* x, uint8_t* dst) {
  BlockQ6_K b{};
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = make_qx(16, 32, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {  // all zero
    store(dst, b);
    return;
  }
  const float iscale = -128.f / max_scale;
  b.d = h(1 / iscale);
  for (int j = 0; j < 16; ++j) b.scales[j] = int8_t(std::min(127, nearest_int(iscale * scales[j])));
  for (int j = 0; j < 16; ++j) {
    const float d = hf(b.d) * b.scales[j];
    if (!d) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = int8_t(std::max(-32, std::min(31, nearest_int(x[16 * j + i] / d))) + 32);
  }
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const int8_t* q = L + 128 * n + l;
      b.ql[64 * n + l] = uint8_t((q[0] & 0xF) | (q[64] & 0xF) << 4);
      b.ql[64 * n + l + 32] = uint8_t((q[32] & 0xF) | (q[96] & 0xF) << 4);
      b.qh[32 * n + l] = uint8_t((q[0] >> 4) | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
    }
  store(dst, b);
}

// The code of `codes` nearest to v (the first on ties, as ggml's best_index_mxfp4).
int nearest_code(const int8_t* codes, float v, float d) {
  int best = 0;
  float err = std::fabs(codes[0] * d - v);
  for (int i = 1; i < 16; ++i) {
    const float e = std::fabs(codes[i] * d - v);
    if (e < err) {
      best = i;
      err = e;
    }
  }
  return best;
}

void encode_mxfp4(const float* x, uint8_t* dst) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  // The largest E2M1 magnitude is 6 = 1.5 * 2^2: the shared exponent is floor(log2 amax) - 2.
  BlockMXFP4 b;
  b.e = amax > 0.0f ? uint8_t(std::max(0.f, std::floor(std::log2(amax)) - 2 + 127)) : 0;
  const float d = float(std::ldexp(1.0, int(b.e) - 128));
  for (int j = 0; j < 16; ++j)
    b.qs[j] = uint8_t(nearest_code(kMXFP4Values, x[j], d) | nearest_code(kMXFP4Values, x[j + 16], d) << 4);
  store(dst, b);
}

// MLX's blocks (core/quant.h). Affine: MLX's own algorithm on a group of 32 (the block);
// MXFP8 and NVFP4: MLX's fp_quantize fallback (mlx/ops.cpp), the scale from the largest
// magnitude (E8M0: 2^rint(log2(amax / 448)); E4M3: amax / 6 rounded to E4M3), each value to
// its nearest code.
void encode_mlx_affine(const float* x, int bits, uint8_t* dst) {
  float sb[2];
  uint32_t q[kMlxBlock], w[8] = {};
  mlx_affine_quantize_group(x, kMlxBlock, bits, sb[0], sb[1], q);
  for (int j = 0; j < kMlxBlock; ++j) mlx_pack(w, j, bits, q[j]);
  std::memcpy(dst, sb, 8);
  std::memcpy(dst + 8, w, 4 * size_t(bits));
}

// The E4M3 code nearest v, ties to the even code, saturating at 448 (MLX's ToFP8 on finite
// inputs). Every scaling below is by a power of two, so nearbyint rounds the exact quotient.
uint8_t f32_to_e4m3(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(double(v));
  int code;
  if (a < 0.015625) {  // below 2^-6, the smallest normal: subnormal steps of 2^-9
    code = int(std::nearbyint(a * 512));  // 8 steps is the smallest normal's code, 0x08
  } else {
    int x;
    std::frexp(a, &x);  // a = f * 2^x, f in [0.5, 1): exponent x - 1
    int e = x - 1, m = int(std::nearbyint((std::ldexp(a, -e) - 1) * 8));
    if (m == 8) m = 0, ++e;
    code = (e + 7) << 3 | m;
  }
  return uint8_t(sign | std::min(code, 0x7E));
}

void encode_mlx_mxfp8(const float* x, uint8_t* dst) {
  float amax = 0;
  for (int j = 0; j < kMlxBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float scale = amax / 448.0f;
  const int e = scale == 0.0f ? 0 : int(std::rint(std::log2(scale)));
  BlockMlxMxfp8 b;
  b.e = uint8_t(std::clamp(e + 127, 0, 254));
  for (int j = 0; j < kMlxBlock; ++j) b.q[j] = f32_to_e4m3(float(std::ldexp(double(x[j]), 127 - int(b.e))));
  store(dst, b);
}

void encode_mlx_nvfp4(const float* x, uint8_t* dst) {
  float amax = 0;
  for (int j = 0; j < kNvfp4Block; ++j) amax = std::max(amax, std::fabs(x[j]));
  BlockMlxNvfp4 b;
  b.s = f32_to_e4m3(amax / 6.0f);
  const float d = 0.5f * e4m3_to_f32(b.s);  // kMXFP4Values holds E2M1 doubled
  for (int j = 0; j < 8; ++j)
    b.qs[j] = uint8_t(nearest_code(kMXFP4Values, x[2 * j], d) | nearest_code(kMXFP4Values, x[2 * j + 1], d) << 4);
  store(dst, b);
}

// Round-to-nearest encoders of our own (see the top of the file).
void encode_iq4_nl(const float* x, uint8_t* dst) {
  float amax, max;
  signed_max(x, 32, amax, max);
  BlockIQ4_NL b;
  const float d = max / kIQ4NLValues[0];  // the signed max lands on -127 (its code's sign)
  b.d = h(d);
  const float dd = hf(b.d);
  for (int j = 0; j < 16; ++j)
    b.qs[j] = uint8_t(nearest_code(kIQ4NLValues, x[j], dd) | nearest_code(kIQ4NLValues, x[j + 16], dd) << 4);
  store(dst, b);
}

void encode_iq4_xs(const float* x, uint8_t* dst) {
  BlockIQ4_XS b{};
  float sub[8], dmax = 0;
  for (int s = 0; s < 8; ++s) {
    float amax, max;
    signed_max(x + 32 * s, 32, amax, max);
    sub[s] = max / kIQ4NLValues[0];
    dmax = std::max(dmax, std::fabs(sub[s]));
  }
  b.d = h(dmax / 31);
  const float d = hf(b.d);
  for (int s = 0; s < 8; ++s) {
    const int ls = d ? std::max(-32, std::min(31, nearest_int(sub[s] / d))) + 32 : 32;
    b.scales_l[s / 2] |= uint8_t((ls & 0xF) << (4 * (s % 2)));
    b.scales_h |= uint16_t((ls >> 4) << (2 * s));
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j)
      b.qs[16 * s + j] = uint8_t(nearest_code(kIQ4NLValues, x[32 * s + j], dl) |
                                 nearest_code(kIQ4NLValues, x[32 * s + j + 16], dl) << 4);
  }
  store(dst, b);
}

void encode_q3_k(const float* x, uint8_t* dst) {
  // Per sub-block of 16, q = round(x / s) in [-4, 3] with s = signed max / -4; the 16 scales
  // as 6-bit multiples (offset 32) of d = max |s| / 31.
  BlockQ3_K b{};
  float sub[16], smax = 0;
  for (int s = 0; s < 16; ++s) {
    float amax, max;
    signed_max(x + 16 * s, 16, amax, max);
    sub[s] = max / -4.f;
    smax = std::max(smax, std::fabs(sub[s]));
  }
  b.d = h(smax / 31);
  const float d = hf(b.d);
  for (int s = 0; s < 16; ++s) {
    const int sc = d ? std::max(-32, std::min(31, nearest_int(sub[s] / d))) : 0;
    const int code = sc + 32;
    if (s < 8) b.scales[s] |= uint8_t(code & 0xF);
    else b.scales[s - 8] |= uint8_t((code & 0xF) << 4);
    b.scales[8 + s % 4] |= uint8_t((code >> 4) << (2 * (s / 4)));
    const float dl = d * sc;
    const int half = s / 8, j = (s % 8) / 2, off = 16 * (s % 2);
    for (int l = 0; l < 16; ++l) {
      const int q = dl ? std::max(-4, std::min(3, nearest_int(x[16 * s + l] / dl))) : 0;
      const int u = q + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask (set: no -4)
      b.qs[32 * half + off + l] |= uint8_t((u & 3) << (2 * j));
      if (u & 4) b.hmask[off + l] |= uint8_t(1 << (4 * half + j));
    }
  }
  store(dst, b);
}

}  // namespace

void mlx_affine_quantize_group(const float* x, int g, int bits, float& scale, float& bias, uint32_t* q) {
  // mlx/backend/cpu/quantized.cpp quantize(), step by step: the scale spans [min, max] in
  // 2^bits - 1 steps, signed so that the edge of larger magnitude is hit exactly (q0 steps
  // from 0), which becomes the bias; rint is MLX's round (ties to even).
  const float n_bins = float((1 << bits) - 1), eps = 1e-7f;
  float w_min = INFINITY, w_max = -INFINITY;
  for (int j = 0; j < g; ++j) {
    w_max = std::max(w_max, x[j]);
    w_min = std::min(w_min, x[j]);
  }
  const bool mask = std::fabs(w_min) > std::fabs(w_max);
  scale = std::max((w_max - w_min) / n_bins, eps);
  scale = mask ? scale : -scale;
  const float edge = mask ? w_min : w_max;
  const float q0 = std::rint(edge / scale);
  bias = 0;
  if (q0 != 0) {
    scale = edge / q0;
    bias = edge;
  }
  for (int j = 0; j < g; ++j)
    q[j] = uint32_t(std::min(std::max(std::rint((x[j] - bias) / scale), 0.0f), n_bins));
}

void quantize_blocks(DType t, const float* x, int64_t nb, uint8_t* dst) {
  const int be = block_elems(t);
  const size_t bb = block_bytes(t);
  for (int64_t i = 0; i < nb; ++i, x += be, dst += bb) {
    switch (t) {
      case DType::Q8_0: encode_q8_0(x, dst); break;
      case DType::Q4_0: encode_q4_5_0(x, dst, false); break;
      case DType::Q5_0: encode_q4_5_0(x, dst, true); break;
      case DType::Q4_1: encode_q4_5_1(x, dst, false); break;
      case DType::Q5_1: encode_q4_5_1(x, dst, true); break;
      case DType::Q2_K: encode_q2_k(x, dst); break;
      case DType::Q3_K: encode_q3_k(x, dst); break;
      case DType::Q4_K: encode_q45_k(x, dst, false); break;
      case DType::Q5_K: encode_q45_k(x, dst, true); break;
      case DType::Q6_K: encode_q6_k(x, dst); break;
      case DType::IQ4_NL: encode_iq4_nl(x, dst); break;
      case DType::IQ4_XS: encode_iq4_xs(x, dst); break;
      case DType::MXFP4: encode_mxfp4(x, dst); break;
      case DType::MLX_Q2: case DType::MLX_Q3: case DType::MLX_Q4: case DType::MLX_Q5: case DType::MLX_Q6:
      case DType::MLX_Q8: encode_mlx_affine(x, mlx_affine_bits(t), dst); break;
      case DType::MLX_MXFP8: encode_mlx_mxfp8(x, dst); break;
      case DType::MLX_NVFP4: encode_mlx_nvfp4(x, dst); break;
      default: throw Error(std::string("[quant] ") + dtype_name(t) + " is not a block format");
    }
  }
}

}  // namespace arbiter
