// Atomic file output: bytes go to PATH.tmp.<pid> and commit() flushes, fsyncs and renames
// the temporary onto PATH, so a reader finds the complete file or none. Traces, full-logits
// files, GGUF and safetensors files are all written through it.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace arbiter {

class AtomicFile {
 public:
  AtomicFile() = default;
  /// Removes the temporary file unless commit() succeeded (an exception or an early return
  /// leaves nothing behind that looks complete).
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Creates PATH.tmp.<pid>. `component` prefixes every error message ("[trace]").
  /// Throws arbiter::Error "[component] TMP: cannot create (reason)".
  void open(const std::string& path, const std::string& component);
  /// Appends n bytes. On failure removes the temporary and throws "[component] TMP: write
  /// failed (reason)".
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  /// Overwrites n bytes at `offset` (already written), then continues at the end.
  void write_at(uint64_t offset, const void* data, size_t n);
  /// Flushes, fsyncs, closes and renames onto the final path. On failure removes the
  /// temporary and throws "[component] PATH: cannot complete (reason)".
  void commit();
  /// Closes and removes the temporary (no-op when nothing is open).
  void discard() noexcept;

  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::FILE* f_ = nullptr;
  std::string path_, tmp_path_, component_;
};

}  // namespace arbiter
