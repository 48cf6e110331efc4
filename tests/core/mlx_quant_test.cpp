// MLX's quantized layouts (core/quant.h): the packing of each affine bit width
// against words worked out by hand from MLX's rule (value i is bits [i*b, i*b + b) of the
// words' little-endian bit stream, LSB first: mlx/ops.cpp pack_and_quantize and
// mlx/backend/cpu/quantized.cpp extract_bits), the repacked blocks' dequantization, E4M3,
// MLX's affine quantizer, and the encoders' error bounds. To add a case: a row of kPacking.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quant.h"

namespace arbiter {
namespace {

struct PackCase {
  int bits;
  uint32_t (*value)(int i);  // the 32 values of one block
  std::vector<uint32_t> words;
};

// Each row: 32 chosen values and the words they pack into, by hand.
const PackCase kPacking[] = {
    // 2 bits, values 0,1,2,3 repeated: each byte is 0 | 1<<2 | 2<<4 | 3<<6 = 0xE4.
    {2, [](int i) { return uint32_t(i % 4); }, {0xE4E4E4E4, 0xE4E4E4E4}},
    // 3 bits, values 0..7 repeated: 8 values are 24 bits reading 76543210 in octal = 0xFAC688;
    // the stream repeats every 24 bits, so word 0 = 0xFAC688 | (0x88 << 24), word 1 starts
    // 8 bits into the pattern (0xFAC6) followed by the next copy's low 16 bits (0xC688), ...
    {3, [](int i) { return uint32_t(i % 8); }, {0x88FAC688, 0xC688FAC6, 0xFAC688FA}},
    // 4 bits, values 0..15 twice: nibble k of the words is value k.
    {4, [](int i) { return uint32_t(i % 16); }, {0x76543210, 0xFEDCBA98, 0x76543210, 0xFEDCBA98}},
    // 5 bits, values 0..31: word 0 = 1<<5 | 2<<10 | 3<<15 | 4<<20 | 5<<25 | (6 & 3)<<30
    // = 0x20 + 0x800 + 0x18000 + 0x400000 + 0xA000000 + 0x80000000 = 0x8A418820; value 6
    // straddles words 0 and 1 (its high 3 bits, 1, open word 1: 0x...39 = 1 | 7<<3).
    {5, [](int i) { return uint32_t(i); }, {0x8A418820, 0xC5A92839, 0xCA307B9A, 0x38BDAB49, 0xFFBBCDEB}},
    // 6 bits, values 1,3,5,...: word 0 = 1 | 3<<6 | 5<<12 | 7<<18 | 9<<24 | (11 & 3)<<30
    // = 1 + 0xC0 + 0x5000 + 0x1C0000 + 0x9000000 + 0xC0000000 = 0xC91C50C1; word 1 opens
    // with 11 >> 2 = 2 then 13<<4 (0x...D2).
    {6, [](int i) { return uint32_t(2 * i + 1); },
     {0xC91C50C1, 0x54D13CD2, 0x7DD6D95D, 0xE99E58E1, 0x5CF1BEDA, 0xFFDEF9DF}},
    // 8 bits, values 7i mod 256: byte k of the words is value k (0, 7, 14, 21 = 0x150E0700).
    {8, [](int i) { return uint32_t(7 * i % 256); },
     {0x150E0700, 0x312A231C, 0x4D463F38, 0x69625B54, 0x857E7770, 0xA19A938C, 0xBDB6AFA8, 0xD9D2CBC4}},
};

TEST(MlxQuant, PackingMatchesHandWorkedWords) {
  for (const PackCase& c : kPacking) {
    SCOPED_TRACE("bits " + std::to_string(c.bits));
    ASSERT_EQ(int(c.words.size()), c.bits);  // 32 values of b bits are b words
    std::vector<uint32_t> w(c.words.size(), 0);
    for (int i = 0; i < 32; ++i) mlx_pack(w.data(), i, c.bits, c.value(i));
    EXPECT_EQ(w, c.words);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(mlx_unpack(c.words.data(), i, c.bits), c.value(i)) << "value " << i;

    // The repacked block: scale, bias, then the same words; x = scale * q + bias.
    const DType t = mlx_affine_dtype(c.bits);
    EXPECT_EQ(mlx_affine_bits(t), c.bits);
    ASSERT_EQ(block_bytes(t), 8 + 4 * size_t(c.bits));
    std::vector<uint8_t> blk(block_bytes(t));
    const float sb[2] = {0.375f, -1.5f};
    std::memcpy(blk.data(), sb, 8);
    std::memcpy(blk.data() + 8, c.words.data(), 4 * c.words.size());
    double y[32];
    float yf[32];
    dequant_blocks(t, blk.data(), 1, y);
    dequant_blocks(t, blk.data(), 1, yf);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(y[i], 0.375 * c.value(i) - 1.5) << "value " << i;
      EXPECT_EQ(double(yf[i]), y[i]) << "value " << i;  // exact in float here
    }
  }
  EXPECT_THROW(mlx_affine_dtype(7), std::exception);
}

TEST(MlxQuant, E4M3AndTheFpBlocks) {
  // E4M3: bias 7, 3 mantissa bits, no infinities.
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);         // e = 7, m = 0
  EXPECT_EQ(e4m3_to_f32(0x3C), 1.5f);         // e = 7, m = 4
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);       // e = 15, m = 6: the largest
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // subnormal 2^-9
  EXPECT_EQ(e4m3_to_f32(0xC0), -2.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));

  // MXFP8: scale 2^(e - 127), values E4M3.
  uint8_t b8[33] = {};
  b8[0] = 125;  // 2^-2
  b8[1] = 0x38;  // 1.0 -> 0.25
  b8[2] = 0xC0;  // -2 -> -0.5
  b8[32] = 0x7E;  // 448 -> 112
  double y8[32];
  dequant_blocks(DType::MLX_MXFP8, b8, 1, y8);
  EXPECT_EQ(y8[0], 0.25);
  EXPECT_EQ(y8[1], -0.5);
  EXPECT_EQ(y8[2], 0.0);
  EXPECT_EQ(y8[31], 112.0);

  // NVFP4: E4M3 scale, E2M1 codes (0, .5, 1, 1.5, 2, 3, 4, 6; 8+ negative), value 2i the low
  // nibble of byte i.
  uint8_t b4[9] = {};
  b4[0] = 0x40;  // E4M3 2.0
  b4[1] = 0x9 << 4 | 0x7;  // value 0: code 7 = 6 -> 12; value 1: code 9 = -0.5 -> -1
  b4[8] = 0x3 << 4 | 0x1;  // value 14: 0.5 -> 1; value 15: 1.5 -> 3
  double y4[16];
  dequant_blocks(DType::MLX_NVFP4, b4, 1, y4);
  EXPECT_EQ(y4[0], 12.0);
  EXPECT_EQ(y4[1], -1.0);
  EXPECT_EQ(y4[2], 0.0);
  EXPECT_EQ(y4[14], 1.0);
  EXPECT_EQ(y4[15], 3.0);
}

// MLX's affine quantizer on a group chosen so that every step is exact: values -1..2 in
// steps of 0.2 at 4 bits. max 2 has the larger magnitude, so scale = -(2 - -1) / 15 = -0.2,
// edge 2, q0 = rint(2 / -0.2) = -10, scale = 2 / -10 = -0.2, bias 2: q = rint((x - 2) / -0.2).
TEST(MlxQuant, AffineGroupQuantizerFollowsMlx) {
  float x[16];
  for (int j = 0; j < 16; ++j) x[j] = float(-1.0 + 0.2 * j);
  float scale, bias;
  uint32_t q[16];
  mlx_affine_quantize_group(x, 16, 4, scale, bias, q);
  EXPECT_FLOAT_EQ(scale, -0.2f);
  EXPECT_EQ(bias, 2.0f);  // the edge of larger magnitude is hit exactly
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[j], uint32_t(15 - j)) << j;
  // A constant group: the scale is eps = 1e-7 (signed), the value exact through the bias.
  const float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  mlx_affine_quantize_group(c, 4, 8, scale, bias, q);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(double(scale) * q[j] + bias, 0.5);
}

// Every MLX block encoder's error on smooth data, against a bound from its format and the
// block's own scale: affine half a step, plus what MLX's clipping to 2^bits - 1 steps loses
// when rounding q0 shrank the scale; MXFP8 half an E4M3 spacing (2^-4 relative, 2^-10 of the
// scale for subnormals) below 448 scales, the clipped excess above; NVFP4 half the largest
// E2M1 gap (1, between 4 and 6) times the scale, or the excess past 6 scales.
TEST(MlxQuant, EncodeErrorWithinFormatBounds) {
  const int n = 1024;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[size_t(i)] = float(0.1 + 2 * std::cos(float(i)));
  for (DType t : {DType::MLX_Q2, DType::MLX_Q3, DType::MLX_Q4, DType::MLX_Q5, DType::MLX_Q6, DType::MLX_Q8,
                  DType::MLX_MXFP8, DType::MLX_NVFP4}) {
    SCOPED_TRACE(dtype_name(t));
    const int be = block_elems(t), bits = mlx_affine_bits(t);
    std::vector<uint8_t> q(dtype_bytes(t, n));
    quantize_blocks(t, x.data(), n / be, q.data());
    std::vector<double> y(n);
    dequant_blocks(t, q.data(), n / be, y.data());
    double se = 0;
    for (int b = 0; b < n / be; ++b) {
      const uint8_t* blk = q.data() + size_t(b) * block_bytes(t);
      double lo = 1e30, hi = -1e30;
      for (int j = 0; j < be; ++j) {
        lo = std::min(lo, double(x[size_t(b * be + j)]));
        hi = std::max(hi, double(x[size_t(b * be + j)]));
      }
      for (int j = 0; j < be; ++j) {
        const double v = x[size_t(b * be + j)], e = std::fabs(y[size_t(b * be + j)] - v);
        double bound;
        if (bits) {
          float sc;
          std::memcpy(&sc, blk, 4);
          const double step = std::fabs(double(sc));
          bound = step / 2 + std::max(0.0, (hi - lo) - ((1 << bits) - 1) * step);
        } else if (t == DType::MLX_MXFP8) {
          const double d = std::ldexp(1.0, int(blk[0]) - 127);
          bound = std::fabs(v) <= 448 * d ? std::max(std::fabs(v) / 16, std::ldexp(d, -10)) : std::fabs(v) - 448 * d;
        } else {
          const double d = e4m3_to_f32(blk[0]);
          bound = std::max(d, std::fabs(v) - 6 * d);
        }
        se += e * e;
        EXPECT_LE(e, bound * (1 + 1e-6)) << "block " << b << " value " << j;
      }
    }
    std::printf("[ mlx      ] %-9s rmse %.5f\n", dtype_name(t), std::sqrt(se / n));
  }
}

}  // namespace
}  // namespace arbiter
