// Dequantization of ggml's block formats: ggml-quants.c dequantize_row_* read as a spec.
//
// Exactness in float: a value is (scale product) * q [- min product]. Each product's operand
// significands fit in 24 bits together (an f16 scale has 11, a 6-bit sub-scale at most 6, an
// int8 scale 7, a quant at most 7 (the IQ4 codebook), at most 24 in every format), so the
// products are exact in float and the one subtraction (or addition) of a min rounds once: the
// float result is the exact value rounded to nearest. The order of the operations below is
// the order that keeps every product exact.
#include "core/quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace arbiter {

const int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};
const int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

bool is_quantized(DType t) { return block_elems(t) > 1; }

int block_elems(DType t) {
  switch (t) {
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16: return 1;
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::IQ4_NL: case DType::MXFP4: return kQK;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_XS: return kQK_K;
    case DType::MLX_Q2: case DType::MLX_Q3: case DType::MLX_Q4: case DType::MLX_Q5: case DType::MLX_Q6:
    case DType::MLX_Q8: case DType::MLX_MXFP8: return kMlxBlock;
    case DType::MLX_NVFP4: return kNvfp4Block;
  }
  return 1;
}

size_t block_bytes(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::F32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::Q8_0: return sizeof(BlockQ8_0);
    case DType::Q4_0: return sizeof(BlockQ4_0);
    case DType::Q4_1: return sizeof(BlockQ4_1);
    case DType::Q5_0: return sizeof(BlockQ5_0);
    case DType::Q5_1: return sizeof(BlockQ5_1);
    case DType::Q2_K: return sizeof(BlockQ2_K);
    case DType::Q3_K: return sizeof(BlockQ3_K);
    case DType::Q4_K: return sizeof(BlockQ4_K);
    case DType::Q5_K: return sizeof(BlockQ5_K);
    case DType::Q6_K: return sizeof(BlockQ6_K);
    case DType::IQ4_NL: return sizeof(BlockIQ4_NL);
    case DType::IQ4_XS: return sizeof(BlockIQ4_XS);
    case DType::MXFP4: return sizeof(BlockMXFP4);
    case DType::MLX_Q2: case DType::MLX_Q3: case DType::MLX_Q4: case DType::MLX_Q5: case DType::MLX_Q6:
    case DType::MLX_Q8: return 8 + 4 * size_t(mlx_affine_bits(t));  // scale, bias, `bits` words
    case DType::MLX_MXFP8: return sizeof(BlockMlxMxfp8);
    case DType::MLX_NVFP4: return sizeof(BlockMlxNvfp4);
  }
  return 0;
}

DType mlx_affine_dtype(int bits) {
  switch (bits) {
    case 2: return DType::MLX_Q2;
    case 3: return DType::MLX_Q3;
    case 4: return DType::MLX_Q4;
    case 5: return DType::MLX_Q5;
    case 6: return DType::MLX_Q6;
    case 8: return DType::MLX_Q8;
  }
  throw Error("[quant] MLX affine bits " + std::to_string(bits) + " (expected 2, 3, 4, 5, 6 or 8)");
}

int mlx_affine_bits(DType t) {
  switch (t) {
    case DType::MLX_Q2: return 2;
    case DType::MLX_Q3: return 3;
    case DType::MLX_Q4: return 4;
    case DType::MLX_Q5: return 5;
    case DType::MLX_Q6: return 6;
    case DType::MLX_Q8: return 8;
    default: return 0;
  }
}

uint32_t mlx_unpack(const uint32_t* words, int64_t i, int bits) {
  const int64_t p = i * bits;
  const int sh = int(p % 32);
  uint64_t v = words[p / 32] >> sh;
  if (sh + bits > 32) v |= uint64_t(words[p / 32 + 1]) << (32 - sh);  // straddles two words
  return uint32_t(v) & ((1u << bits) - 1);
}

void mlx_pack(uint32_t* words, int64_t i, int bits, uint32_t q) {
  const int64_t p = i * bits;
  const int sh = int(p % 32);
  words[p / 32] |= q << sh;
  if (sh + bits > 32) words[p / 32 + 1] |= q >> (32 - sh);
}

float e4m3_to_f32(uint8_t v) {
  const int e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return v & 0x80 ? -mag : mag;
}

bool block_scales_finite(DType t, const uint8_t* blk) {
  // Offsets of the f16 fields in each block struct.
  size_t off[2];
  int n = 0;
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS:
      off[n++] = 0;
      break;
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K:
      off[n++] = 0;
      off[n++] = 2;
      break;
    case DType::Q2_K: off[n++] = offsetof(BlockQ2_K, d); off[n++] = offsetof(BlockQ2_K, dmin); break;
    case DType::Q3_K: off[n++] = offsetof(BlockQ3_K, d); break;
    case DType::Q6_K: off[n++] = offsetof(BlockQ6_K, d); break;
    case DType::MLX_Q2: case DType::MLX_Q3: case DType::MLX_Q4: case DType::MLX_Q5: case DType::MLX_Q6:
    case DType::MLX_Q8: {
      float sb[2];
      std::memcpy(sb, blk, 8);
      return std::isfinite(sb[0]) && std::isfinite(sb[1]);
    }
    case DType::MLX_MXFP8: return blk[0] != 0xFF;  // E8M0 0xFF is NaN (OCP MX)
    case DType::MLX_NVFP4: return (blk[0] & 0x7F) != 0x7F;
    default: break;
  }
  for (int i = 0; i < n; ++i) {
    uint16_t hv;
    std::memcpy(&hv, blk + off[i], 2);
    if ((hv & 0x7C00) == 0x7C00) return false;
  }
  return true;
}

namespace {

template <class B>
B load(const uint8_t* p) {
  B b;
  std::memcpy(&b, p, sizeof(B));
  return b;
}

template <class O>
O h(uint16_t f16) { return O(f16_to_f32(f16)); }

// The 16 6-bit scales of a Q3_K super-block (ggml's kmask unpacking written per scale):
// scale j has its low 4 bits in a nibble of bytes 0..7 and its high 2 bits in bytes 8..11.
void q3k_scales(const uint8_t* s, int sc[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = (lo | hi << 4) - 32;
  }
}

template <class O>
void dequant(DType t, const uint8_t* src, int64_t nb, O* y) {
  const size_t bb = block_bytes(t);
  for (int64_t i = 0; i < nb; ++i, src += bb) {
    switch (t) {
      case DType::Q8_0: {
        auto b = load<BlockQ8_0>(src);
        const O d = h<O>(b.d);
        for (int j = 0; j < 32; ++j) y[j] = d * O(b.qs[j]);
        y += 32;
        break;
      }
      case DType::Q4_0: {  // x = d * (q - 8); low nibbles are values 0..15, high 16..31
        auto b = load<BlockQ4_0>(src);
        const O d = h<O>(b.d);
        for (int j = 0; j < 16; ++j) {
          y[j] = d * O((b.qs[j] & 0xF) - 8);
          y[j + 16] = d * O((b.qs[j] >> 4) - 8);
        }
        y += 32;
        break;
      }
      case DType::Q4_1: {  // x = d * q + m
        auto b = load<BlockQ4_1>(src);
        const O d = h<O>(b.d), m = h<O>(b.m);
        for (int j = 0; j < 16; ++j) {
          y[j] = d * O(b.qs[j] & 0xF) + m;
          y[j + 16] = d * O(b.qs[j] >> 4) + m;
        }
        y += 32;
        break;
      }
      case DType::Q5_0:
      case DType::Q5_1: {  // 5th bit of value j is bit j of qh (little-endian u32)
        const bool q51 = t == DType::Q5_1;
        uint16_t dh, mh = 0;
        uint32_t qh;
        const uint8_t* qs;
        if (q51) {
          auto b = load<BlockQ5_1>(src);
          dh = b.d;
          mh = b.m;
          std::memcpy(&qh, b.qh, 4);
          qs = src + offsetof(BlockQ5_1, qs);
        } else {
          auto b = load<BlockQ5_0>(src);
          dh = b.d;
          std::memcpy(&qh, b.qh, 4);
          qs = src + offsetof(BlockQ5_0, qs);
        }
        const O d = h<O>(dh), m = h<O>(mh);
        for (int j = 0; j < 16; ++j) {
          const int q0 = (qs[j] & 0xF) | int((qh >> j) & 1) << 4;
          const int q1 = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
          if (q51) {
            y[j] = d * O(q0) + m;
            y[j + 16] = d * O(q1) + m;
          } else {
            y[j] = d * O(q0 - 16);
            y[j + 16] = d * O(q1 - 16);
          }
        }
        y += 32;
        break;
      }
      case DType::Q2_K: {
        // 16 sub-blocks of 16; scales[s]: low nibble scale, high nibble min. Quants: 2 bits,
        // byte l of each 32-byte half holds values l, l+32, l+64, l+96 of that 128 (shift 0..6).
        auto b = load<BlockQ2_K>(src);
        const O d = h<O>(b.d), dmin = h<O>(b.dmin);
        for (int s = 0; s < 16; ++s) {
          const O dl = d * O(b.scales[s] & 0xF), ml = dmin * O(b.scales[s] >> 4);
          const int half = s / 8, shift = 2 * ((s % 8) / 2), off = 16 * (s % 2);
          for (int l = 0; l < 16; ++l)
            y[16 * s + l] = dl * O((b.qs[32 * half + off + l] >> shift) & 3) - ml;
        }
        y += 256;
        break;
      }
      case DType::Q3_K: {
        // As Q2_K's 2-bit layout, plus a high bit from hmask (bit s/2 of byte l): a clear bit
        // subtracts 4. Scales: 6 bits, offset by 32.
        auto b = load<BlockQ3_K>(src);
        const O d = h<O>(b.d);
        int sc[16];
        q3k_scales(b.scales, sc);
        for (int s = 0; s < 16; ++s) {
          const O dl = d * O(sc[s]);
          const int half = s / 8, j = (s % 8) / 2, off = 16 * (s % 2);
          const int m = 1 << (4 * half + j);
          for (int l = 0; l < 16; ++l) {
            const int q = ((b.qs[32 * half + off + l] >> (2 * j)) & 3) - ((b.hmask[off + l] & m) ? 0 : 4);
            y[16 * s + l] = dl * O(q);
          }
        }
        y += 256;
        break;
      }
      case DType::Q4_K:
      case DType::Q5_K: {
        // 8 sub-blocks of 32 with 6-bit scale and min; 64 values per 32 bytes of qs (low
        // nibbles first); Q5_K's 5th bit of value l of sub-block s is bit s of qh[l].
        const bool q5 = t == DType::Q5_K;
        uint16_t dh, mh;
        const uint8_t *scales, *qs, *qh = nullptr;
        if (q5) {
          auto b = load<BlockQ5_K>(src);
          dh = b.d;
          mh = b.dmin;
          scales = src + offsetof(BlockQ5_K, scales);
          qh = src + offsetof(BlockQ5_K, qh);
          qs = src + offsetof(BlockQ5_K, qs);
        } else {
          auto b = load<BlockQ4_K>(src);
          dh = b.d;
          mh = b.dmin;
          scales = src + offsetof(BlockQ4_K, scales);
          qs = src + offsetof(BlockQ4_K, qs);
        }
        const O d = h<O>(dh), dmin = h<O>(mh);
        for (int s = 0; s < 8; ++s) {
          uint8_t sc, m;
          scale_min_k4(s, scales, sc, m);
          const O dl = d * O(sc), ml = dmin * O(m);
          const uint8_t* q = qs + 32 * (s / 2);
          for (int l = 0; l < 32; ++l) {
            int v = (s % 2) ? q[l] >> 4 : q[l] & 0xF;
            if (q5 && (qh[l] >> s & 1)) v += 16;
            y[32 * s + l] = dl * O(v) - ml;
          }
        }
        y += 256;
        break;
      }
      case DType::Q6_K: {
        // 16 sub-blocks of 16 with int8 scales; per 128 values: 64 bytes of low nibbles and
        // 32 of high 2-bit pairs; value l + 32 k of that 128 (k = 0..3) takes nibble k / 2 of
        // ql[l + 32 (k % 2)] and bits 2k..2k+1 of qh[l]; q - 32.
        auto b = load<BlockQ6_K>(src);
        const O d = h<O>(b.d);
        for (int n = 0; n < 2; ++n)
          for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l) {
              const uint8_t lo = b.ql[64 * n + l + 32 * (k % 2)];
              const int q = ((k / 2 ? lo >> 4 : lo & 0xF) | ((b.qh[32 * n + l] >> (2 * k)) & 3) << 4) - 32;
              const int s = 8 * n + 2 * k + l / 16;
              y[128 * n + 32 * k + l] = d * O(b.scales[s]) * O(q);
            }
        y += 256;
        break;
      }
      case DType::IQ4_NL: {
        auto b = load<BlockIQ4_NL>(src);
        const O d = h<O>(b.d);
        for (int j = 0; j < 16; ++j) {
          y[j] = d * O(kIQ4NLValues[b.qs[j] & 0xF]);
          y[j + 16] = d * O(kIQ4NLValues[b.qs[j] >> 4]);
        }
        y += 32;
        break;
      }
      case DType::IQ4_XS: {
        // 8 sub-blocks of 32; 6-bit scale ls (low 4 bits in scales_l, high 2 in scales_h) - 32.
        auto b = load<BlockIQ4_XS>(src);
        const O d = h<O>(b.d);
        for (int s = 0; s < 8; ++s) {
          const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b.scales_h >> (2 * s)) & 3) << 4;
          const O dl = d * O(ls - 32);
          for (int j = 0; j < 16; ++j) {
            y[32 * s + j] = dl * O(kIQ4NLValues[b.qs[16 * s + j] & 0xF]);
            y[32 * s + j + 16] = dl * O(kIQ4NLValues[b.qs[16 * s + j] >> 4]);
          }
        }
        y += 256;
        break;
      }
      case DType::MXFP4: {
        // E8M0 scale 2^(e-127) times E2M1; the table holds E2M1 doubled, so 2^(e-128).
        auto b = load<BlockMXFP4>(src);
        const O d = O(std::ldexp(1.0, int(b.e) - 128));
        for (int j = 0; j < 16; ++j) {
          y[j] = d * O(kMXFP4Values[b.qs[j] & 0xF]);
          y[j + 16] = d * O(kMXFP4Values[b.qs[j] >> 4]);
        }
        y += 32;
        break;
      }
      case DType::MLX_Q2: case DType::MLX_Q3: case DType::MLX_Q4: case DType::MLX_Q5: case DType::MLX_Q6:
      case DType::MLX_Q8: {
        // scale * q is exact in double (24 + 8 bits); the sum is exact too unless bias and
        // scale * q lie more than 2^21 apart, and the float result is that sum rounded once.
        float sb[2];
        uint32_t w[8];
        const int bits = mlx_affine_bits(t);
        std::memcpy(sb, src, 8);
        std::memcpy(w, src + 8, 4 * size_t(bits));
        for (int j = 0; j < kMlxBlock; ++j)
          y[j] = O(double(sb[0]) * double(mlx_unpack(w, j, bits)) + double(sb[1]));
        y += kMlxBlock;
        break;
      }
      case DType::MLX_MXFP8: {
        // E4M3 (4 significant bits) times a power of two: exact wherever float's range holds it.
        auto b = load<BlockMlxMxfp8>(src);
        const double d = std::ldexp(1.0, int(b.e) - 127);
        for (int j = 0; j < kMlxBlock; ++j) y[j] = O(d * double(e4m3_to_f32(b.q[j])));
        y += kMlxBlock;
        break;
      }
      case DType::MLX_NVFP4: {
        // E2M1 (doubled in kMXFP4Values, hence the half) times an E4M3 scale: exact.
        auto b = load<BlockMlxNvfp4>(src);
        const double d = 0.5 * double(e4m3_to_f32(b.s));
        for (int j = 0; j < 8; ++j) {
          y[2 * j] = O(d * kMXFP4Values[b.qs[j] & 0xF]);
          y[2 * j + 1] = O(d * kMXFP4Values[b.qs[j] >> 4]);
        }
        y += kNvfp4Block;
        break;
      }
      case DType::F64: case DType::F32: case DType::F16: case DType::BF16:
        ARB_ASSERT(!"dequant_blocks of a dense type");
    }
  }
}

}  // namespace

void dequant_blocks(DType t, const uint8_t* src, int64_t nb, double* dst) { dequant(t, src, nb, dst); }
void dequant_blocks(DType t, const uint8_t* src, int64_t nb, float* dst) { dequant(t, src, nb, dst); }

}  // namespace arbiter
