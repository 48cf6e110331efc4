// Helpers of the matrix tests: run from the repository root (specs name models by relative
// path, as the shipped specs do), small specs that finish in seconds, reading results.json.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace arbiter::test {

/// chdir to the repository root (relative model paths in specs refer to it).
inline void enter_source_dir() {
  ASSERT_EQ(::chdir(ARBITER_SOURCE_DIR), 0);
}

/// A two-tier spec on the shipped model with extra arms/candidates; shapes cheap enough for CI.
inline std::string small_spec(const std::string& candidates, const std::string& extra_arms,
                              const std::string& shapes = "[\"w1\", \"w8\"]",
                              const std::string& chunks = "w1 = 48\nw8 = 4") {
  return "corpus = \"models/corpus/stories.txt\"\n"
         "models = [\"models/TinyStories-656K\"]\n"
         "shapes = " +
         shapes +
         "\n"
         "reference = \"ref\"\n"
         "allow_long_context = true\n"  // w8 passes TinyStories-656K's 512 positions
         "candidates = " +
         candidates +
         "\n"
         "[chunks]\n" +
         chunks +
         "\n"
         "[arms.ref]\ndevice = \"ref\"\n"
         "[arms.cpu]\ndevice = \"cpu\"\nthreads = 2\n" +
         extra_arms + "[controls]\naa = [\"ref\"]\nnoise_floor = [[\"ref\", \"cpu\"]]\n";
}

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path));
}

/// The comparison of cand (vs ref unless aa) at shape in results.json, or null.
inline nlohmann::json comparison(const nlohmann::json& results, const std::string& shape,
                                 const std::string& cand, bool aa = false) {
  for (const auto& c : results["comparisons"])
    if (c["shape"] == shape && c["cand"] == cand && c["aa"] == aa) return c;
  return nullptr;
}

}  // namespace arbiter::test
