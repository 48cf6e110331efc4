#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace arbiter {

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
  if (f_) {
    std::fclose(f_);
    f_ = nullptr;
  }
  if (!tmp_path_.empty()) {
    std::remove(tmp_path_.c_str());
    tmp_path_.clear();
  }
}

void AtomicFile::fail(const std::string& what, int err) {
  discard();
  throw Error(component_ + " " + what + " (" + std::strerror(err) + ")");
}

void AtomicFile::open(const std::string& path, const std::string& component) {
  ARB_CHECK(!f_, "%s %s: file already open on %s", component.c_str(), path.c_str(), path_.c_str());
  component_ = component;
  path_ = path;
  tmp_path_ = path + ".tmp." + std::to_string(::getpid());
  f_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!f_) {
    int err = errno;
    std::string tmp = tmp_path_;
    tmp_path_.clear();
    throw Error(component_ + " " + tmp + ": cannot create (" + std::strerror(err) + ")");
  }
}

void AtomicFile::write(const void* data, size_t n) {
  ARB_CHECK(f_, "%s write before open", component_.c_str());
  if (n > 0 && std::fwrite(data, 1, n, f_) != n) fail(tmp_path_ + ": write failed", errno);
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  ARB_CHECK(f_, "%s write before open", component_.c_str());
  if (std::fseek(f_, long(offset), SEEK_SET) != 0 || std::fwrite(data, 1, n, f_) != n ||
      std::fseek(f_, 0, SEEK_END) != 0)
    fail(tmp_path_ + ": write failed", errno);
}

void AtomicFile::commit() {
  ARB_CHECK(f_, "%s commit before open", component_.c_str());
  bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  int err = errno;
  ok = std::fclose(f_) == 0 && ok;
  f_ = nullptr;
  if (!ok) fail(path_ + ": cannot complete", errno ? errno : err);
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) fail(path_ + ": cannot complete", errno);
  tmp_path_.clear();
}

}  // namespace arbiter
