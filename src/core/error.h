// Errors: arbiter::Error for anything a caller or an input file can cause (thrown),
// ARB_ASSERT for internal invariants (always on; throws with expression and file:line so
// the CLI still exits cleanly instead of aborting).
#pragma once
#include <exception>
#include <stdexcept>
#include <string>

namespace arbiter {

/// One error type for bad input and failed loads. The message starts with the component
/// in brackets and names the file, offset or line, and what was expected:
///   [gguf] model.gguf: tensor 'blk.3.ffn_up.weight' at offset 91234 runs past end of file
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// printf-style formatting into a std::string (used to build Error messages).
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void assert_fail(const char* expr, const char* file, int line);

/// Names what this thread is doing while it lives ("loading model m.gguf"), so that an
/// out-of-memory failure (std::bad_alloc) can be reported with the file and the allocation
/// it happened in (describe_failure). Scopes nest; the innermost one the failure left is
/// reported.
class ActivityScope {
 public:
  explicit ActivityScope(std::string what);
  ~ActivityScope();
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;

 private:
  std::string what_;
};

/// The one-line description of an exception that is not an arbiter::Error: for
/// std::bad_alloc "out of memory while <innermost activity>", else "unexpected error: what".
std::string describe_failure(const std::exception& e);

}  // namespace arbiter

#define ARB_ASSERT(x) \
  do { if (!(x)) ::arbiter::assert_fail(#x, __FILE__, __LINE__); } while (0)

/// Throws arbiter::Error built from a printf-style message when cond is false.
#define ARB_CHECK(cond, ...) \
  do { if (!(cond)) throw ::arbiter::Error(::arbiter::strformat(__VA_ARGS__)); } while (0)
