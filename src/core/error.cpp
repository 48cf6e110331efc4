#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
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

namespace {
// The innermost scope an exception unwound, copied without allocating (it is written while
// a std::bad_alloc is in flight, from a destructor).
thread_local char tl_failed[512];
}  // namespace

ActivityScope::ActivityScope(std::string what) : what_(std::move(what)) {
  if (std::uncaught_exceptions() == 0) tl_failed[0] = '\0';  // an earlier failure was handled
}

ActivityScope::~ActivityScope() {
  // Unwinding out of a scope: remember it for describe_failure, which runs after the
  // scopes are gone (in the CLI's catch). The innermost scope is recorded first and kept.
  if (std::uncaught_exceptions() > 0 && tl_failed[0] == '\0') {
    std::strncpy(tl_failed, what_.c_str(), sizeof tl_failed - 1);
    tl_failed[sizeof tl_failed - 1] = '\0';
  }
}

std::string describe_failure(const std::exception& e) {
  std::string where = tl_failed[0] ? std::string(" while ") + tl_failed : std::string();
  tl_failed[0] = '\0';
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of memory" + where + " (" + e.what() + ")";
  return "unexpected error" + where + ": " + e.what();
}

void assert_fail(const char* expr, const char* file, int line) {
  throw Error(strformat("[internal] assertion failed: %s at %s:%d", expr, file, line));
}

}  // namespace arbiter
