// ggml block formats (core/quant.h): one hand-worked block per type. The bytes are written
// here from ggml-common.h's structs, and each expected value is worked out in its comment
// from the format's formula (docs/quantization.md), not taken from our output. Then, on
// seeded random blocks of every type, the float path is the double path rounded once.
//
// To add a type: a block whose fields exercise every bit group (low/high nibbles, the extra
// high bits, signed scale offsets), and the elements at the group boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <random>
#include <vector>

#include "core/quant.h"

namespace arbiter {
namespace {

// f16 bit patterns: 1.0, 0.5, -1.0.
constexpr uint16_t kOne = 0x3C00, kHalf = 0x3800, kMinusOne = 0xBC00;

template <class B>
std::vector<double> deq(DType t, const B& b) {
  EXPECT_EQ(sizeof(B), block_bytes(t));
  std::vector<double> y(size_t(block_elems(t)));
  uint8_t raw[sizeof(B)];
  std::memcpy(raw, &b, sizeof(B));
  dequant_blocks(t, raw, 1, y.data());
  return y;
}

// Nibble pattern of the 32-value types: qs[j] = j | (15 - j) << 4, so value j (low nibble)
// has q = j and value j + 16 (high nibble) has q = 15 - j.
template <class B>
void ramp(B& b) {
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (15 - j) << 4);
}

TEST(Quant, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalf;
  ramp(b);
  auto y = deq(DType::Q4_0, b);  // x = d (q - 8)
  EXPECT_EQ(y[0], -4.0);         // q 0
  EXPECT_EQ(y[5], -1.5);         // q 5
  EXPECT_EQ(y[15], 3.5);         // q 15
  EXPECT_EQ(y[16], 3.5);         // high nibble of qs[0]: 15
  EXPECT_EQ(y[31], -4.0);        // high nibble of qs[15]: 0
}

TEST(Quant, Q4_1) {
  BlockQ4_1 b{};
  b.d = kHalf;
  b.m = kMinusOne;
  ramp(b);
  auto y = deq(DType::Q4_1, b);  // x = d q + m
  EXPECT_EQ(y[0], -1.0);
  EXPECT_EQ(y[3], 0.5);    // 1.5 - 1
  EXPECT_EQ(y[15], 6.5);   // 7.5 - 1
  EXPECT_EQ(y[16], 6.5);   // q 15
  EXPECT_EQ(y[31], -1.0);  // q 0
}

TEST(Quant, Q5_0AndQ5_1) {
  // qh = 0x80000001: value 0 and value 31 get the 5th bit (16).
  BlockQ5_0 b{};
  b.d = kOne;
  b.qh[0] = 0x01;
  b.qh[3] = 0x80;
  ramp(b);
  auto y = deq(DType::Q5_0, b);  // x = d (q - 16)
  EXPECT_EQ(y[0], 0.0);          // 0 | 16
  EXPECT_EQ(y[1], -15.0);        // 1
  EXPECT_EQ(y[15], -1.0);        // 15
  EXPECT_EQ(y[16], -1.0);        // high nibble of qs[0]: 15, bit 16 clear
  EXPECT_EQ(y[30], -15.0);       // high nibble of qs[14]: 1
  EXPECT_EQ(y[31], 0.0);         // high nibble of qs[15]: 0, bit 31 set: 16

  BlockQ5_1 c{};
  c.d = kHalf;
  c.m = kOne;
  c.qh[0] = 0x01;
  c.qh[3] = 0x80;
  ramp(c);
  y = deq(DType::Q5_1, c);  // x = d q + m
  EXPECT_EQ(y[0], 9.0);     // 16 / 2 + 1
  EXPECT_EQ(y[1], 1.5);     // 1 / 2 + 1
  EXPECT_EQ(y[16], 8.5);    // 15 / 2 + 1
  EXPECT_EQ(y[30], 1.5);
  EXPECT_EQ(y[31], 9.0);
}

TEST(Quant, Q2_K) {
  // Sub-block s (16 values) has scale scales[s] & 15 and min scales[s] >> 4;
  // x = d * scale * q - dmin * min. Value 32 j + 16 h + l of each 128 takes bits 2j of
  // qs[32 * half + 16 h + l].
  BlockQ2_K b{};
  b.d = kOne;
  b.dmin = kHalf;
  b.scales[0] = 0x21;   // scale 1, min 2
  b.scales[1] = 0x03;   // scale 3, min 0
  b.scales[2] = 0x14;   // scale 4, min 1
  b.scales[15] = 0xF2;  // scale 2, min 15
  b.qs[0] = 0xE4;       // 2-bit fields 0, 1, 2, 3 (values 0, 32, 64, 96)
  b.qs[16] = 0x03;      // value 16: 3
  b.qs[63] = 0xC0;      // value 255 (bits 6-7 of the last byte): 3
  auto y = deq(DType::Q2_K, b);
  EXPECT_EQ(y[0], -1.0);   // 1 * 0 - 0.5 * 2
  EXPECT_EQ(y[1], -1.0);   // q 0
  EXPECT_EQ(y[16], 9.0);   // 3 * 3 - 0
  EXPECT_EQ(y[32], 3.5);   // 4 * 1 - 0.5 * 1
  EXPECT_EQ(y[64], 0.0);   // sub-block 4: scale 0, min 0
  EXPECT_EQ(y[255], -1.5);  // 2 * 3 - 0.5 * 15
}

TEST(Quant, Q3_K) {
  // 6-bit scales minus 32: scale j's low nibble is in byte j (j < 8) or the high nibble of
  // byte j - 8; its top 2 bits are bits 2 (j / 4) of byte 8 + j % 4. q = 2-bit field - 4
  // unless the hmask bit (bit 4 half + j of hmask[16 h + l]) is set.
  BlockQ3_K b{};
  b.d = kOne;
  b.scales[0] = 0x51;   // scale 0 low 1, scale 8 low 5
  b.scales[8] = 0x22;   // scale 0 high 2 (33), scale 8 high 2 (37)
  b.scales[7] = 0xE0;   // scale 15 low 14
  b.scales[11] = 0x40;  // scale 15 high 1 (30)
  b.qs[0] = 0x02;
  b.hmask[0] = 0x01;
  b.qs[32] = 0x01;
  b.qs[63] = 0xC0;
  b.hmask[31] = 0x80;
  auto y = deq(DType::Q3_K, b);
  EXPECT_EQ(y[0], 2.0);     // (33 - 32) * 2, high bit set
  EXPECT_EQ(y[1], -4.0);    // 1 * (0 - 4)
  EXPECT_EQ(y[16], 128.0);  // scale 1 code 0: -32; q 0 - 4
  EXPECT_EQ(y[128], -15.0); // scale 8: 5; q 1 - 4 (hmask bit 4 clear)
  EXPECT_EQ(y[255], -6.0);  // scale 15: -2; q 3 (hmask[31] bit 7 set)
}

// Q4_K and Q5_K share the 12 scale bytes: sub-blocks 0-3 take the low 6 bits of bytes j
// (scale) and j + 4 (min); 4-7 a nibble of byte j + 4 and the top 2 bits of bytes j - 4
// (scale) and j (min).
template <class B>
void k4_scales(B& b) {
  b.d = kOne;
  b.dmin = kHalf;
  b.scales[0] = 0x02;   // sub-block 0 scale 2
  b.scales[4] = 0x03;   // sub-block 0 min 3
  b.scales[1] = 0x05;   // sub-block 1 scale 5, min 0
  b.scales[11] = 0x21;  // sub-block 7 scale low 1, min low 2
  b.scales[3] = 0x40;   // sub-block 7 scale high 1: 17
  b.scales[7] = 0xC0;   // sub-block 7 min high 3: 50
  b.qs[0] = 0xA7;       // value 0: 7, value 32: 10
  b.qs[127] = 0xF0;     // value 223: 0, value 255: 15
}

TEST(Quant, Q4_K) {
  BlockQ4_K b{};
  k4_scales(b);
  uint8_t sc, m;
  scale_min_k4(7, b.scales, sc, m);
  EXPECT_EQ(sc, 17);
  EXPECT_EQ(m, 50);
  auto y = deq(DType::Q4_K, b);  // x = d * scale * q - dmin * min
  EXPECT_EQ(y[0], 12.5);    // 2 * 7 - 1.5
  EXPECT_EQ(y[1], -1.5);    // q 0
  EXPECT_EQ(y[32], 50.0);   // 5 * 10
  EXPECT_EQ(y[224], -25.0); // 17 * 0 - 0.5 * 50
  EXPECT_EQ(y[255], 230.0); // 17 * 15 - 25
}

// The word-parallel decode gives scale_min_k4's fields for every bit pattern of a byte in
// every position: the hand-worked block, then random 12-byte patterns.
TEST(Quant, ScalesMinsK4WordsMatchTheFieldDecode) {
  BlockQ4_K b{};
  k4_scales(b);
  uint64_t sc, m;
  scales_mins_k4(b.scales, sc, m);
  EXPECT_EQ(sc >> 56, 17u);
  EXPECT_EQ(m >> 56, 50u);
  EXPECT_EQ(sc & 0xFF, 2u);
  EXPECT_EQ((m & 0xFF), 3u);
  std::mt19937 rng(12);
  for (int t = 0; t < 4096; ++t) {
    uint8_t q[12];
    for (uint8_t& v : q) v = uint8_t(rng());
    scales_mins_k4(q, sc, m);
    for (int j = 0; j < 8; ++j) {
      uint8_t s1, m1;
      scale_min_k4(j, q, s1, m1);
      ASSERT_EQ(uint8_t(sc >> (8 * j)), s1) << "scale " << j << " of pattern " << t;
      ASSERT_EQ(uint8_t(m >> (8 * j)), m1) << "min " << j << " of pattern " << t;
    }
  }
}

TEST(Quant, Q5_K) {
  BlockQ5_K b{};
  k4_scales(b);
  b.qh[0] = 0x03;   // bit s of qh[l]: +16 for value l of sub-block s (0 and 1)
  b.qh[31] = 0x80;  // value 31 of sub-block 7
  auto y = deq(DType::Q5_K, b);
  EXPECT_EQ(y[0], 44.5);    // 2 * 23 - 1.5
  EXPECT_EQ(y[1], -1.5);
  EXPECT_EQ(y[32], 130.0);  // 5 * 26
  EXPECT_EQ(y[224], -25.0);
  EXPECT_EQ(y[255], 502.0); // 17 * 31 - 25
}

TEST(Quant, Q6_K) {
  // Per 128 values: value 32 k + l takes nibble k / 2 of ql[l + 32 (k % 2)] and bits 2k of
  // qh[l]; q - 32; int8 scale of sub-block 8 n + 2 k + l / 16.
  BlockQ6_K b{};
  b.d = kHalf;
  b.scales[0] = 2;
  b.scales[1] = -3;
  b.scales[2] = 4;
  b.scales[4] = 1;
  b.scales[15] = -128;
  b.ql[0] = 0x5F;    // value 0 low 15, value 64 low 5
  b.qh[0] = 0x09;    // value 0 high 1, value 32 high 2
  b.ql[32] = 0x03;   // value 32 low 3
  b.ql[127] = 0xF0;  // value 255 low 15
  b.qh[63] = 0xC0;   // value 255 high 3
  auto y = deq(DType::Q6_K, b);
  EXPECT_EQ(y[0], -1.0);      // 0.5 * 2 * (31 - 32)
  EXPECT_EQ(y[16], 48.0);     // 0.5 * -3 * (0 - 32)
  EXPECT_EQ(y[32], 6.0);      // 0.5 * 4 * (35 - 32)
  EXPECT_EQ(y[64], -13.5);    // 0.5 * 1 * (5 - 32)
  EXPECT_EQ(y[255], -1984.0); // 0.5 * -128 * (63 - 32)
}

TEST(Quant, IQ4_NL) {
  BlockIQ4_NL b{};
  b.d = kHalf;
  b.qs[0] = 0xF0;   // codes 0 (-127) and 15 (113)
  b.qs[15] = 0x78;  // codes 8 (1) and 7 (-10)
  auto y = deq(DType::IQ4_NL, b);
  EXPECT_EQ(y[0], -63.5);
  EXPECT_EQ(y[16], 56.5);
  EXPECT_EQ(y[15], 0.5);
  EXPECT_EQ(y[31], -5.0);
}

TEST(Quant, IQ4_XS) {
  // 6-bit sub-block scale: nibble s % 2 of scales_l[s / 2], top bits 2s of scales_h; - 32.
  BlockIQ4_XS b{};
  b.d = kOne;
  b.scales_l[0] = 0x01;  // sub-block 0 low 1
  b.scales_l[3] = 0xE0;  // sub-block 7 low 14
  b.scales_h = 0x4002;   // sub-block 0 high 2 (33), sub-block 7 high 1 (30)
  b.qs[0] = 0xF0;
  b.qs[127] = 0x08;
  auto y = deq(DType::IQ4_XS, b);
  EXPECT_EQ(y[0], -127.0);   // 1 * -127
  EXPECT_EQ(y[16], 113.0);   // 1 * 113
  EXPECT_EQ(y[32], 4064.0);  // sub-block 1 scale 0 - 32: -32 * -127
  EXPECT_EQ(y[239], -2.0);   // -2 * 1
  EXPECT_EQ(y[255], 254.0);  // -2 * -127
}

TEST(Quant, MXFP4) {
  // OCP MX: scale 2^(e - 127) times E2M1 (codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 sign).
  BlockMXFP4 b[2] = {};
  b[0].e = 128;     // 2
  b[0].qs[0] = 0x7F;  // codes 15 (-6) and 7 (6)
  b[1].e = 127;     // 1
  b[1].qs[0] = 0x31;  // codes 1 (0.5) and 3 (1.5)
  uint8_t raw[sizeof b];
  std::memcpy(raw, b, sizeof b);
  std::vector<double> y(64);
  dequant_blocks(DType::MXFP4, raw, 2, y.data());
  EXPECT_EQ(y[0], -12.0);
  EXPECT_EQ(y[16], 12.0);
  EXPECT_EQ(y[1], 0.0);  // code 0
  EXPECT_EQ(y[32], 0.5);
  EXPECT_EQ(y[48], 1.5);
}

TEST(Quant, FloatIsTheExactValueRoundedOnce) {
  std::mt19937 rng(7);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    const int nb = 8;
    std::vector<uint8_t> raw(nb * block_bytes(t));
    for (uint8_t& c : raw) c = uint8_t(rng());
    std::vector<double> d(size_t(nb * block_elems(t)));
    std::vector<float> f(d.size());
    dequant_blocks(t, raw.data(), nb, d.data());
    dequant_blocks(t, raw.data(), nb, f.data());
    for (size_t i = 0; i < d.size(); ++i)
      if (!(std::isnan(d[i]) && std::isnan(f[i]))) {
        ASSERT_EQ(float(d[i]), f[i]) << dtype_name(t) << " value " << i;
      }
  }
}

// llama.cpp tests/test-quantize-fns.cpp: its synthetic data (0.1 + 2 cos(i + offset), 4096
// values), its error measure (sqrt of the summed squared error, divided by n) and its
// per-type thresholds; quantized by our encoders, dequantized exactly.
TEST(Quant, EncodeErrorWithinLlamaCppThresholds) {
  const size_t n = 32 * 128;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(0.1 + double(2 * std::cos(float(i))));  // C: 0.1 + 2*cosf(i)
  struct Want {
    DType t;
    double max_error;
  };
  // MAX_QUANTIZATION_TOTAL_ERROR 0.002; _2BITS 0.0075 (Q2_K); _3BITS 0.004 (Q3_K).
  for (Want w : {Want{DType::Q8_0, 0.002}, {DType::Q4_0, 0.002}, {DType::Q4_1, 0.002}, {DType::Q5_0, 0.002},
                 {DType::Q5_1, 0.002}, {DType::Q2_K, 0.0075}, {DType::Q3_K, 0.004}, {DType::Q4_K, 0.002},
                 {DType::Q5_K, 0.002}, {DType::Q6_K, 0.002}, {DType::IQ4_NL, 0.002}, {DType::IQ4_XS, 0.002},
                 {DType::MXFP4, 0.002}}) {
    std::vector<uint8_t> q(dtype_bytes(w.t, int64_t(n)));
    std::vector<double> y(n);
    quantize_blocks(w.t, x.data(), int64_t(n) / block_elems(w.t), q.data());
    dequant_blocks(w.t, q.data(), int64_t(n) / block_elems(w.t), y.data());
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    const double err = std::sqrt(sum) / double(n);
    EXPECT_LT(err, w.max_error) << dtype_name(w.t);
  }
}

// Byte identity with ggml's reference quantizers (what llama-quantize runs without an
// imatrix) on test-quantize-fns' data: tests/fixtures/quant/ggml_ref_blocks.txt, one line
// per type, made by ggml_ref_blocks.c linked against llama.cpp's ggml-quants.c (v0.4.0,
// commit 80fb11a; tests/fixtures/README.md).
TEST(Quant, EncodersMatchGgmlReferenceBytes) {
  std::ifstream f(std::string(ARBITER_SOURCE_DIR) + "/tests/fixtures/quant/ggml_ref_blocks.txt");
  ASSERT_TRUE(f.good());
  const size_t n = 4096;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(0.1 + double(2 * std::cos(float(i))));
  std::string name, hex;
  int lines = 0;
  while (f >> name >> hex) {
    ++lines;
    const DType t = dtype_from_name(name);
    std::vector<uint8_t> q(dtype_bytes(t, int64_t(n)));
    quantize_blocks(t, x.data(), int64_t(n) / block_elems(t), q.data());
    ASSERT_EQ(hex.size(), 2 * q.size()) << name;
    size_t differ = 0, first = q.size();
    for (size_t i = 0; i < q.size(); ++i)
      if (std::stoul(hex.substr(2 * i, 2), nullptr, 16) != q[i]) {
        if (differ++ == 0) first = i;
      }
    EXPECT_EQ(differ, 0u) << name << ": " << differ << " bytes differ, first at byte " << first;
  }
  EXPECT_EQ(lines, 10);
}

// Encoders against values worked out from the reference quantizers' formulas.
TEST(Quant, EncodersByHand) {
  // Q8_0: amax 2.54 -> d = 0.02 (f16 0x251F = 0.0200042...), q = round(x / d).
  float x[32] = {};
  x[0] = 2.54f;
  x[1] = -1.0f;
  uint8_t raw[34];
  quantize_blocks(DType::Q8_0, x, 1, raw);
  BlockQ8_0 b8;
  std::memcpy(&b8, raw, 34);
  EXPECT_EQ(b8.d, 0x251F);
  EXPECT_EQ(b8.qs[0], 127);
  EXPECT_EQ(b8.qs[1], -50);  // -1 / 0.0200000 = -50.0
  EXPECT_EQ(b8.qs[2], 0);
  // Q4_0: signed max -4 -> d = -4 / -8 = 0.5; q = trunc(x / d + 8.5), at most 15.
  x[0] = -4.0f;
  x[1] = 3.9f;  // 7.8 + 8.5 = 16.3 -> 15
  x[2] = 0.26f;  // 0.52 + 8.5 -> 9
  uint8_t r4[18];
  quantize_blocks(DType::Q4_0, x, 1, r4);
  BlockQ4_0 b4;
  std::memcpy(&b4, r4, 18);
  EXPECT_EQ(b4.d, kHalf);
  EXPECT_EQ(b4.qs[0] & 0xF, 0);
  EXPECT_EQ(b4.qs[1] & 0xF, 15);
  EXPECT_EQ(b4.qs[2] & 0xF, 9);
  EXPECT_EQ(b4.qs[3] & 0xF, 8);  // 0 -> 8
  // MXFP4: amax 6 -> e = floor(log2 6) - 2 + 127 = 127 (scale 1): values are E2M1 themselves.
  float m[32] = {};
  m[0] = 6.0f;
  m[1] = -0.5f;
  m[2] = 2.4f;  // nearest E2M1: 2
  uint8_t rm[17];
  quantize_blocks(DType::MXFP4, m, 1, rm);
  EXPECT_EQ(rm[0], 127);
  EXPECT_EQ(rm[1] & 0xF, 7);   // +6
  EXPECT_EQ(rm[2] & 0xF, 9);   // -0.5
  EXPECT_EQ(rm[3] & 0xF, 4);   // 2
}

TEST(Quant, NamesAndSizes) {
  EXPECT_EQ(dtype_from_name("q4_k"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("mxfp4"), DType::MXFP4);
  EXPECT_FALSE(is_compute_dtype(DType::Q6_K));
  EXPECT_EQ(dtype_bytes(DType::Q4_K, 512), 288u);  // 2 super-blocks of 144 bytes
  EXPECT_EQ(dtype_bytes(DType::MXFP4, 64), 34u);
}

}  // namespace
}  // namespace arbiter
