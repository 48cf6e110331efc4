// Session 39: the f32 FMA rate against vdpbf16ps's on one core of the 2-vCPU Zen 5 VM.
// 24 independent accumulator chains of each, 20M iterations, three rounds; a FLOP is a
// multiply or an add (an FMA lane 2, a vdpbf16ps lane 4). Not part of the build:
//   gcc -O2 -march=native dpbf16-peak.c -o dpbf16-peak && ./dpbf16-peak
// Output on that VM (idle): fma 258 GFLOP/s, dpbf16 514-516 GFLOP/s per core.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#define N 24
int main(void) {
  __m512 acc[N];
  for (int i = 0; i < N; i++) acc[i] = _mm512_set1_ps(i * 1e-3f);
  __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  __m512bh ah = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  __m512bh bh = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f);
  const long it = 20000000;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now();
    for (long i = 0; i < it; i++) {
#pragma GCC unroll 24
      for (int j = 0; j < N; j++) acc[j] = _mm512_fmadd_ps(a, acc[j], b);
      __asm__ volatile("" : "+v"(a));
    }
    double t1 = now();
    for (long i = 0; i < it; i++) {
#pragma GCC unroll 24
      for (int j = 0; j < N; j++) acc[j] = _mm512_dpbf16_ps(acc[j], ah, bh);
      __asm__ volatile("" : "+v"(ah));
    }
    double t2 = now();
    float s = 0;
    for (int j = 0; j < N; j++) s += _mm512_reduce_add_ps(acc[j]);
    printf("fma %.1f GFLOP/s  dpbf16 %.1f GFLOP/s (%g)\n", it * N * 32.0 / (t1 - t0) * 1e-9,
           it * N * 64.0 / (t2 - t1) * 1e-9, s);
  }
  return 0;
}
