// Errors that are not arbiter::Error (src/core/error.h): an out-of-memory is reported with the
// activity it interrupted, never as a bare "std::bad_alloc". Add a case: throw from inside
// the scopes and state the line describe_failure must give.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "core/error.h"

using namespace arbiter;

namespace {

template <class F>
std::string failure_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return describe_failure(e);
  }
  return "(no failure)";
}

}  // namespace

TEST(DescribeFailure, OutOfMemoryNamesTheInnermostActivity) {
  EXPECT_EQ(failure_of([] {
              ActivityScope outer("loading model m.gguf");
              ActivityScope inner("reading tokenizer.json");
              throw std::bad_alloc();
            }),
            "out of memory while reading tokenizer.json (std::bad_alloc)");
  // Outside any scope: still named as what it is.
  EXPECT_EQ(failure_of([] { throw std::bad_alloc(); }), "out of memory (std::bad_alloc)");
  EXPECT_EQ(failure_of([] {
              ActivityScope s("tracing c.txt");
              throw std::logic_error("boom");
            }),
            "unexpected error while tracing c.txt: boom");
}

TEST(DescribeFailure, AHandledFailureDoesNotNameALaterOne) {
  try {
    ActivityScope s("an earlier step");
    throw Error("handled");
  } catch (const Error&) {
  }
  EXPECT_EQ(failure_of([] {
              ActivityScope s("the second step");
              throw std::bad_alloc();
            }),
            "out of memory while the second step (std::bad_alloc)");
}
