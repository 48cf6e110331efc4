#include "io/mmap.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/file.h"

namespace arbiter {

MappedFile::MappedFile(const std::string& path, const std::string& component)
    : path_(path), file_(std::make_unique<InputFile>(path, component)) {
  size_ = size_t(file_->size());
  // mmap of length 0 fails with EINVAL; an empty file is a valid (empty) mapping.
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file_->fd(), 0);
    if (p == MAP_FAILED)
      throw Error(component + " " + path + ": cannot map " + std::to_string(size_) + " bytes (" +
                  std::strerror(errno) + ")");
    data_ = static_cast<const uint8_t*>(p);
  }
}

std::shared_ptr<MappedFile> MappedFile::from_bytes(const std::string& name, std::string bytes) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = name;
  f->bytes_ = std::move(bytes);
  f->data_ = reinterpret_cast<const uint8_t*>(f->bytes_.data());
  f->size_ = f->bytes_.size();
  return f;
}

MappedFile::~MappedFile() {
  if (file_ && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace arbiter
