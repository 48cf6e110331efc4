// SHA-256 of the shipped model (models/TinyStories-656K/model.safetensors, 1.3 MB): what every
// load, trace header and store verify pays per byte of weights. The file is read once into
// memory so that the hash, not the disk, is timed; bytes/s is the hash rate.
#include <benchmark/benchmark.h>
#include <openssl/evp.h>

#include <string>
#include <vector>

#include "io/file.h"
#include "io/sha256.h"

namespace arbiter::bench {
namespace {

std::vector<uint8_t> shipped_model() {
  const std::string path = std::string(ARBITER_SOURCE_DIR) + "/models/TinyStories-656K/model.safetensors";
  InputFile f(path, "[bench]");
  std::vector<uint8_t> b(size_t(f.size()));
  f.read_at(0, b.data(), b.size());
  return b;
}

void BM_sha256_handwritten(benchmark::State& st) {
  const std::vector<uint8_t> b = shipped_model();
  for (auto _ : st) {
    Sha256 h(st.range(0) != 0);
    h.update(b.data(), b.size());
    benchmark::DoNotOptimize(h.digest());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(b.size()));
  st.SetLabel(st.range(0) ? "SHA-NI" : "portable");
}
BENCHMARK(BM_sha256_handwritten)->Name("sha256/handwritten")->Arg(0)->Arg(1);

void BM_sha256_openssl(benchmark::State& st) {
  const std::vector<uint8_t> b = shipped_model();
  for (auto _ : st) {
    EVP_MD_CTX* c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), nullptr);
    EVP_DigestUpdate(c, b.data(), b.size());
    unsigned char d[32];
    unsigned n = 0;
    EVP_DigestFinal_ex(c, d, &n);
    EVP_MD_CTX_free(c);
    benchmark::DoNotOptimize(d);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(b.size()));
}
BENCHMARK(BM_sha256_openssl)->Name("sha256/openssl_evp");

}  // namespace
}  // namespace arbiter::bench
