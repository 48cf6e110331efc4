#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace arbiter {

std::string strformat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), size_t(n) + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

void assert_fail(const char* expr, const char* file, int line) {
  throw Error(strformat("[internal] assertion failed: %s at %s:%d", expr, file, line));
}

}  // namespace arbiter
