// Errors: arbiter::Error for anything a caller or an input file can cause (thrown),
// ARB_ASSERT for internal invariants (always on; throws with expression and file:line so
// the CLI still exits cleanly instead of aborting).
#pragma once
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

}  // namespace arbiter

#define ARB_ASSERT(x) \
  do { if (!(x)) ::arbiter::assert_fail(#x, __FILE__, __LINE__); } while (0)

/// Throws arbiter::Error built from a printf-style message when cond is false.
#define ARB_CHECK(cond, ...) \
  do { if (!(cond)) throw ::arbiter::Error(::arbiter::strformat(__VA_ARGS__)); } while (0)
