#include "io/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace arbiter {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("[mmap] " + path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw Error("[mmap] " + path + ": cannot stat (" + std::strerror(e) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("[mmap] " + path + ": not a regular file");
  }
  size_ = size_t(st.st_size);
  // mmap of length 0 fails with EINVAL; an empty file is a valid (empty) mapping.
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw Error("[mmap] " + path + ": cannot map " + std::to_string(size_) + " bytes (" +
                  std::strerror(e) + ")");
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  // The mapping stays valid after close (POSIX), so no descriptor is held per model file.
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace arbiter
