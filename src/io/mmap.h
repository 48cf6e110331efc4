// Read-only memory-mapped files: weights are used in place, never copied at load.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace arbiter {

class MappedFile {
 public:
  /// Maps the whole file read-only; throws arbiter::Error naming the path on failure.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace arbiter
