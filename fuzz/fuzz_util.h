// Shared by the libFuzzer harnesses (docs/reliability.md §7): a parser may accept an input or refuse
// it with one arbiter::Error; anything else it throws is a finding, reported by aborting so
// that libFuzzer saves the input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"

namespace arbiter::fuzz {

inline std::string bytes(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

/// Runs fn; an arbiter::Error is a clean refusal, any other exception a finding.
template <class F>
void expect_clean(F&& fn) {
  try {
    fn();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unclean error: %s\n", e.what());
    std::abort();
  }
}

/// Keeps a computed value alive so the work that made it is not optimised away.
template <class T>
void sink(const T& v) {
  static volatile T keep;
  keep = v;
}

}  // namespace arbiter::fuzz
