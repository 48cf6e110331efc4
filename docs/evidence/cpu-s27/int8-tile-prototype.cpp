// Throwaway prototype (session 27), kept as the evidence for docs/performance.md's estimate of
// an integer prefill GEMM for Q4_K; not product code. One thread, everything in L1:
//   f32_tile:  gemm.cpp's broadcast-weights tile, 12 weight rows x 32 tokens, K = 1024 f32
//   int8_tile: 16 weight rows (the lanes) x MT tokens over Q4_K-like super-blocks of 256:
//              u8 codes interleaved [64 groups of 4][16 rows][4], vpdpbusd per sub-block of 32,
//              vpmullo by the 6-bit sub-scales, the mins through vpdpwssd of the q8_K sums,
//              one f32 FMA pair per block (values are placeholders: speed only).
// Build and run: g++ -O3 -march=native int8-tile-prototype.cpp -o proto && ./proto
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

__attribute__((noinline)) void f32_tile(const float* w, const float* xp, long kc, float* c) {
  constexpr long kLd = 272;
  __m512 acc[12][2];
  for (int m = 0; m < 12; ++m)
    for (int v = 0; v < 2; ++v) acc[m][v] = _mm512_loadu_ps(c + m * 32 + v * 16);
  for (long k = 0; k < kc; ++k) {
    const __m512 x0 = _mm512_loadu_ps(xp + k * 32), x1 = _mm512_loadu_ps(xp + k * 32 + 16);
#pragma GCC unroll 16
    for (int m = 0; m < 12; ++m) {
      const __m512 a = _mm512_set1_ps(w[m * kLd + k]);
      acc[m][0] = _mm512_fmadd_ps(a, x0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, x1, acc[m][1]);
    }
  }
  for (int m = 0; m < 12; ++m)
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(c + m * 32 + v * 16, acc[m][v]);
}

struct WBlock { uint8_t codes[64][16][4]; int32_t sc[8][16]; int16_t mn[4][16][2]; float d[16], dmin[16]; };
struct XTok { int8_t q[256]; int16_t bs[4][2]; float d; };  // bs: pairs of sub-block sums (32)
template <int MT>
__attribute__((noinline)) void int8_tile(const WBlock* wb, int nb, const XTok* x /*[nb][MT]*/, float* out /*[MT][16]*/) {
  __m512 y[MT];
  for (int t = 0; t < MT; ++t) y[t] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const WBlock& w = wb[b];
    const XTok* xb = x + b * MT;
    __m512i isum[MT], msum[MT];
    for (int t = 0; t < MT; ++t) { isum[t] = _mm512_setzero_si512(); msum[t] = _mm512_setzero_si512(); }
    for (int s = 0; s < 8; ++s) {
      __m512i a[MT];
      for (int t = 0; t < MT; ++t) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m512i wv = _mm512_loadu_si512(w.codes[s * 8 + g]);
#pragma GCC unroll 16
        for (int t = 0; t < MT; ++t) {
          int32_t xv; __builtin_memcpy(&xv, xb[t].q + s * 32 + g * 4, 4);
          a[t] = _mm512_dpbusd_epi32(a[t], wv, _mm512_set1_epi32(xv));
        }
      }
      const __m512i scv = _mm512_loadu_si512(w.sc[s]);
      for (int t = 0; t < MT; ++t) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(a[t], scv));
    }
    for (int p = 0; p < 4; ++p) {
      const __m512i mv = _mm512_loadu_si512(w.mn[p]);
      for (int t = 0; t < MT; ++t) {
        int32_t bv; __builtin_memcpy(&bv, xb[t].bs[p], 4);
        msum[t] = _mm512_dpwssd_epi32(msum[t], mv, _mm512_set1_epi32(bv));
      }
    }
    const __m512 dv = _mm512_loadu_ps(w.d), mdv = _mm512_loadu_ps(w.dmin);
    for (int t = 0; t < MT; ++t) {
      const __m512 dx = _mm512_set1_ps(xb[t].d);
      y[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, dx), y[t]);
      y[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(mdv, dx), y[t]);
    }
  }
  for (int t = 0; t < MT; ++t) _mm512_storeu_ps(out + t * 16, y[t]);
}

template <int MT>
double run_int8(int reps) {
  const int nb = 4;  // K = 1024
  std::vector<WBlock> w(nb);
  std::vector<XTok> x(nb * MT);
  std::vector<float> out(MT * 16);
  for (auto& b : w) {
    for (auto& c : b.codes) for (auto& r : c) for (auto& v : r) v = 7;
    for (auto& s : b.sc) for (auto& v : s) v = 3;
    for (auto& m : b.mn) for (auto& r : m) for (auto& v : r) v = 2;
    for (auto& v : b.d) v = 0.01f;
    for (auto& v : b.dmin) v = 0.001f;
  }
  for (auto& t : x) {
    for (auto& v : t.q) v = 5;
    for (auto& p : t.bs) for (auto& v : p) v = 100;
    t.d = 0.02f;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) int8_tile<MT>(w.data(), nb, x.data(), out.data());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * 16 * MT * 256 * nb * reps / s / 1e9;
}

double run_f32(int reps) {
  const long kc = 256;
  std::vector<float> w(12 * 272, 0.001f), x(kc * 32, 0.001f), c(12 * 32, 0.f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f32_tile(w.data(), x.data(), kc, c.data());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * 12 * 32 * kc * reps / s / 1e9;
}

int main() {
  for (int round = 0; round < 3; ++round)
    std::printf("round %d: f32 tile %.1f GFLOP/s; int8 tile (GFLOP/s-equivalent, 2 per MAC): MT 2 %.1f, MT 4 %.1f, MT 6 %.1f, MT 8 %.1f\n",
                round, run_f32(200000), run_int8<2>(400000), run_int8<4>(400000), run_int8<6>(300000),
                run_int8<8>(200000));
}
