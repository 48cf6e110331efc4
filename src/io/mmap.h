// Read-only memory-mapped files: weights are used in place, never copied at load.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace arbiter {

class InputFile;

class MappedFile {
 public:
  /// Maps the whole file read-only; throws arbiter::Error "[component] PATH: ..." when it
  /// cannot be opened, is not a regular file (io/file.h) or cannot be mapped. The file stays
  /// open, and registered as an input, while the mapping lives.
  explicit MappedFile(const std::string& path, const std::string& component = "[mmap]");
  /// Bytes already in memory, under a name used in messages (fuzz harnesses, tests).
  static std::shared_ptr<MappedFile> from_bytes(const std::string& name, std::string bytes);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  std::unique_ptr<InputFile> file_;  // null for from_bytes
  std::string bytes_;                // from_bytes' storage
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace arbiter
