// SHA-256 of the shipped model (models/TinyStories-656K/model.safetensors, 1.3 MB) through
// io/sha256.h (OpenSSL EVP): what every load, trace header and store verify pays per byte of
// weights. The file is read once into memory so that the hash, not the disk, is timed;
// bytes/s is the hash rate. docs/performance.md §SHA-256 has the hand-written code's numbers
// from the same benchmark before it was replaced.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "io/file.h"
#include "io/sha256.h"

namespace arbiter::bench {
namespace {

void BM_sha256_model(benchmark::State& st) {
  const std::string path = std::string(ARBITER_SOURCE_DIR) + "/models/TinyStories-656K/model.safetensors";
  InputFile f(path, "[bench]");
  std::vector<uint8_t> b(size_t(f.size()));
  f.read_at(0, b.data(), b.size());
  for (auto _ : st) benchmark::DoNotOptimize(sha256_hex(b.data(), b.size()));
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(b.size()));
}
BENCHMARK(BM_sha256_model)->Name("sha256/openssl_evp");

}  // namespace
}  // namespace arbiter::bench
