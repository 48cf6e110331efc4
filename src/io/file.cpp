#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"

namespace arbiter {

namespace {

// An open input. Its descriptor keeps the inode alive, so (device, inode) cannot be reused
// by another file while the entry exists.
struct InputId {
  dev_t dev;
  ino_t ino;
  std::string path;
  const InputFile* owner;
};

std::mutex g_inputs_mutex;
std::vector<InputId>& inputs() {
  static std::vector<InputId> v;
  return v;
}

void register_input(const InputFile* owner, const std::string& path, const struct stat& st) {
  std::lock_guard<std::mutex> lock(g_inputs_mutex);
  inputs().push_back({st.st_dev, st.st_ino, path, owner});
}

void unregister_input(const InputFile* owner) {
  std::lock_guard<std::mutex> lock(g_inputs_mutex);
  auto& v = inputs();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].owner == owner) {
      v.erase(v.begin() + long(i));
      return;
    }
}

[[noreturn]] void fail(const std::string& component, const std::string& path, const std::string& what) {
  throw Error(component + " " + path + ": " + what);
}

}  // namespace

const char* file_type_name(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

InputFile::InputFile(const std::string& path, const std::string& component)
    : path_(path), component_(component) {
  // O_NONBLOCK: opening a FIFO without a writer (or a device that waits for carrier) returns
  // at once instead of blocking; the fstat below then refuses it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) {
    int err = errno;
    struct stat st;
    // A socket cannot be opened at all (ENXIO): say what it is rather than the errno text.
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      fail(component, path, std::string("is ") + file_type_name(st.st_mode) + " (expected a regular file)");
    fail(component, path, std::string("cannot open (") + std::strerror(err) + ")");
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    fail(component, path, std::string("cannot stat (") + std::strerror(err) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail(component, path, std::string("is ") + file_type_name(st.st_mode) + " (expected a regular file)");
  }
  size_ = uint64_t(st.st_size);
  register_input(this, path, st);
}

InputFile::~InputFile() {
  unregister_input(this);
  ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd_, p + done, n - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(component_, path_,
           strformat("read of %zu bytes at offset %llu failed (%s)", n, (unsigned long long)offset,
                     r < 0 ? std::strerror(errno) : "unexpected end of file"));
    done += size_t(r);
  }
}

std::string InputFile::read_all(uint64_t max_bytes, const char* what) {
  if (size_ > max_bytes)
    fail(component_, path_,
         strformat("%llu bytes, over the %llu-byte limit for %s", (unsigned long long)size_,
                   (unsigned long long)max_bytes, what));
  std::string data;
  try {
    data.resize(size_t(size_));
  } catch (const std::bad_alloc&) {
    fail(component_, path_, strformat("out of memory for the %llu bytes of %s", (unsigned long long)size_, what));
  }
  read_at(0, data.data(), data.size());
  // The file may have grown since fstat; what was there at open is what we read.
  return data;
}

std::string read_input_file(const std::string& path, const std::string& component, uint64_t max_bytes,
                            const char* what) {
  return InputFile(path, component).read_all(max_bytes, what);
}

void check_output_target(const std::string& path, const std::string& component) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;  // nothing there yet (or a dangling symlink)
  if (!S_ISREG(st.st_mode))
    fail(component, path, std::string("is ") + file_type_name(st.st_mode) + "; refusing to replace it with an output");
  std::lock_guard<std::mutex> lock(g_inputs_mutex);
  for (const InputId& i : inputs())
    if (i.dev == st.st_dev && i.ino == st.st_ino)
      fail(component, path,
           i.path == path ? std::string("is also an input of this run; refusing to overwrite it")
                          : "is the input " + i.path + "; refusing to overwrite it");
}

}  // namespace arbiter
