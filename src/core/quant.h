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

/// ggml's non-linear 4-bit codebooks: kvalues_iq4nl, and kvalues_mxfp4 (the E2M1 values
/// doubled, so that the block scale 2^(e-127) is applied as 2^(e-128)).
extern const int8_t kIQ4NLValues[16];
extern const int8_t kMXFP4Values[16];

/// Whether t is one of ggml's block formats (Q8_0 included).
bool is_quantized(DType t);
/// Values per block (1 for the dense types) and bytes per block (the element size for them).
int block_elems(DType t);
size_t block_bytes(DType t);

/// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block, unpacked from
/// its 12 scale bytes (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m);

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
