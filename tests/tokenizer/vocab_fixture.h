// Test fixtures for the tokenizer suite.
//
// llama.cpp's vocab-only GGUFs and their test vectors are ~16 MB together, more than the
// repository should carry, so tests unpack the files they need from
// ../shared/models/llama.cpp-vocab.tar.xz at run time (and SKIP when it is absent). Each
// unpacked file is checked against the SHA256SUMS inside the archive.
//
// Vector format (llama.cpp tests/test-tokenizer-0): NAME.gguf.inp holds the test strings
// separated by "\n__ggml_vocab_test__\n"; NAME.gguf.out one line of ids per string,
// tokenized without BOS/EOS and without parsing special tokens.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/sha256.h"
#include "test_util.h"

namespace arbiter::test {

struct VocabVectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> expected;
};

/// <repo>/models/rel if shipped, else ../shared/models/rel, else "".
inline std::string model_file(const std::string& rel) {
  std::string p = source_path("models/" + rel);
  if (std::filesystem::exists(p)) return p;
  return shared_path("models/" + rel);
}

/// Path of NAME.gguf unpacked into a temp dir (with .inp/.out when with_vectors), or ""
/// with *why set when the archive is missing. Throws (test failure) on a checksum mismatch.
inline std::string vocab_gguf(const std::string& name, bool with_vectors, std::string* why) {
  std::string tar = shared_path("models/llama.cpp-vocab.tar.xz");
  if (tar.empty()) {
    *why = "../shared/models/llama.cpp-vocab.tar.xz is absent";
    return "";
  }
  std::string dir = temp_dir("vocab");
  std::vector<std::string> files = {name + ".gguf", "SHA256SUMS"};
  if (with_vectors) {
    files.push_back(name + ".gguf.inp");
    files.push_back(name + ".gguf.out");
  }
  std::string cmd = "tar -xJf '" + tar + "' -C '" + dir + "'";
  for (const auto& f : files) cmd += " 'llama.cpp-vocab/" + f + "'";
  if (std::system((cmd + " 2>/dev/null").c_str()) != 0) {
    *why = "could not unpack " + name + " from " + tar;
    return "";
  }
  std::string base = dir + "/llama.cpp-vocab/";
  std::istringstream sums(read_file(base + "SHA256SUMS"));
  std::string hex, file;
  size_t checked = 0;
  while (sums >> hex >> file) {
    if (file.rfind("./", 0) == 0) file = file.substr(2);
    for (const auto& f : files)
      if (f == file) {
        if (sha256_file(base + f) != hex) throw std::runtime_error("checksum mismatch for " + f);
        ++checked;
      }
  }
  if (checked + 1 != files.size()) throw std::runtime_error("SHA256SUMS does not list every file of " + name);
  return base + name + ".gguf";
}

/// Reads the .inp/.out pair next to gguf_path.
inline VocabVectors read_vocab_vectors(const std::string& gguf_path) {
  VocabVectors v;
  const std::string inp = read_file(gguf_path + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  // The file ends with a separator, so the piece after the last one is empty.
  size_t p = 0;
  while (true) {
    size_t q = inp.find(sep, p);
    if (q == std::string::npos) break;
    v.inputs.push_back(inp.substr(p, q - p));
    p = q + sep.size();
  }
  std::istringstream out(read_file(gguf_path + ".out"));
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    int64_t id;
    while (ls >> id) ids.push_back(static_cast<int32_t>(id));
    v.expected.push_back(ids);
  }
  return v;
}

}  // namespace arbiter::test
