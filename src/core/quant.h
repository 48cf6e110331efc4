// ggml's quantized block formats (ggml/src/ggml-common.h block_* structs, ggml-quants.c
// dequantize_row_*), read by every tier through dequant_blocks. Layouts are ggml's: a row of
// K values is K / block_elems(t) blocks of block_bytes(t) bytes, each block self-contained.
// docs/quantization.md writes out each type's formula.
//
// Blocks are read through memcpy into the structs below, never through a cast pointer: in a
// GGUF file a 17-byte MXFP4 block (or any block after one) can sit at any byte address.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace arbiter {

constexpr int kQK = 32;    // values per block of the legacy types, IQ4_NL and MXFP4
constexpr int kQK_K = 256;  // values per super-block of the k-quants and IQ4_XS

struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };
struct BlockIQ4_XS { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 &&
                  sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
                  sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 && sizeof(BlockMXFP4) == 17,
              "block sizes must be ggml's");

/// MLX's quantized weights (mlx/ops.cpp affine_quantize / fp_quantize; docs/quantization.md),
/// as model/mlx.cpp repacks them at load into self-contained blocks, so that every tier reads
/// them through dequant_blocks like ggml's:
/// - MLX_Q2..MLX_Q8 (affine, bits b): 32 values = f32 scale, f32 bias (MLX stores them in the
///   model dtype, f32/f16/bf16, each exact in f32), then the b uint32 words MLX packed those 32
///   values into (a group of 32/64/128 is split into blocks sharing its scale and bias). Value
///   j is bits [j*b, j*b + b) of the words read as one little-endian bit stream, LSB first
///   (words hold 32/b values for b = 2, 4, 8; for b = 3, 5, 6 a value may straddle two
///   words); x = scale * q + bias.
/// - MLX's mxfp4 is ggml's MXFP4 block (same E8M0 scale, same E2M1 codes; nibbles reordered).
/// - MLX_MXFP8: 32 values = E8M0 scale e, then 32 E4M3 bytes; x = e4m3(q) * 2^(e - 127).
/// - MLX_NVFP4: 16 values = E4M3 scale s, then 8 bytes of E2M1 codes (value 2i the low nibble
///   of byte i, 2i+1 the high one); x = e2m1(q) * e4m3(s).
constexpr int kMlxBlock = 32;     // values per block of the affine types and MLX_MXFP8
constexpr int kNvfp4Block = 16;   // values per block (and per MLX group) of MLX_NVFP4
struct BlockMlxMxfp8 { uint8_t e; uint8_t q[32]; };
struct BlockMlxNvfp4 { uint8_t s; uint8_t qs[8]; };
static_assert(sizeof(BlockMlxMxfp8) == 33 && sizeof(BlockMlxNvfp4) == 9, "MLX block sizes");

/// The affine type of `bits` (2, 3, 4, 5, 6 or 8), and the bits of one (0 for another type).
DType mlx_affine_dtype(int bits);
int mlx_affine_bits(DType t);
/// Value i of a packed MLX affine row: bits [i*bits, i*bits + bits) of the little-endian
/// bit stream of `words`, LSB first.
uint32_t mlx_unpack(const uint32_t* words, int64_t i, int bits);
/// The inverse: ORs q (< 2^bits) into value slot i of `words` (which start zeroed).
void mlx_pack(uint32_t* words, int64_t i, int bits, uint32_t q);
/// OCP FP8 E4M3 (bias 7, no infinities, 0x7F/0xFF NaN) as a float; exact.
float e4m3_to_f32(uint8_t v);
/// MLX's affine quantization of one group of g values (mlx/ops.cpp affine_quantize's
/// fallback, operation by operation in f32): scale and bias (before their rounding to the
/// model dtype, which MLX does after computing q) and the g quants.
void mlx_affine_quantize_group(const float* x, int g, int bits, float& scale, float& bias, uint32_t* q);

/// ggml's non-linear 4-bit codebooks: kvalues_iq4nl, and kvalues_mxfp4 (the E2M1 values
/// doubled, so that the block scale 2^(e-127) is applied as 2^(e-128)).
extern const int8_t kIQ4NLValues[16];
extern const int8_t kMXFP4Values[16];

/// Whether t is one of ggml's block formats (Q8_0 included) or an MLX block.
bool is_quantized(DType t);
/// Values per block (1 for the dense types) and bytes per block (the element size for them).
int block_elems(DType t);
size_t block_bytes(DType t);

/// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block, unpacked from
/// its 12 scale bytes (ggml's get_scale_min_k4).
/// Inline: the cpu tier's integer kernels call it 8 times per super-block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  // Sub-blocks 0..3: low 6 bits of bytes j and j+4. 4..7: a nibble of byte j+4 plus the two
  // spare high bits of bytes j-4 (scale) and j (min).
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// All 8 scales and mins at once, byte j of sc and m (little-endian) being scale_min_k4(j):
/// the same fields taken from the 12 bytes as three words, 4 sub-blocks per mask.
inline void scales_mins_k4(const uint8_t* q, uint64_t& sc, uint64_t& m) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  // Bits 6-7 of a byte moved to bits 4-5: (w >> 2) & 0x30 per byte.
  sc = uint64_t(w[0] & 0x3F3F3F3Fu) | uint64_t((w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u)) << 32;
  m = uint64_t(w[1] & 0x3F3F3F3Fu) | uint64_t(((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u)) << 32;
}

/// Whether every f16 scale (and min) of one block of type t at blk is finite (MXFP4's E8M0
/// scale has none that is not: ggml reads 0xFF as 2^127).
bool block_scales_finite(DType t, const uint8_t* blk);

/// dst[0, nb * block_elems(t)) = the values of nb blocks of type t at src. In double every
/// value is exact; in float every value is the exact one rounded once (each format's products
/// of its scales and quants fit in 24 bits, so only the added min rounds, see quant.cpp).
void dequant_blocks(DType t, const uint8_t* src, int64_t nb, double* dst);
void dequant_blocks(DType t, const uint8_t* src, int64_t nb, float* dst);

/// Encodes nb blocks of type t from x[0, nb * block_elems(t)) into dst (core/quant_encode.cpp:
/// llama.cpp's reference quantizers for the types llama-quantize writes without an imatrix,
/// plain round-to-nearest for Q3_K, IQ4_NL and IQ4_XS).
void quantize_blocks(DType t, const float* x, int64_t nb, uint8_t* dst);

}  // namespace arbiter
