// Every file arbiter reads is opened here (docs/reliability.md). An input path may name
// anything: a FIFO would block open() forever, /dev/zero would never end, a directory or a
// socket would fail in a confusing way. So an input is opened O_RDONLY | O_NONBLOCK (open()
// never waits for a FIFO's writer), checked with fstat to be a regular file, and read with a
// size limit. While an InputFile is open its identity (device, inode) is registered, so that
// an output about to replace a file refuses when that file is an input in use
// (check_output_target, used by AtomicFile): keep an input's InputFile (or MappedFile) alive
// until the outputs computed from it are committed.
#pragma once
#include <cstdint>
#include <string>

namespace arbiter {

/// Size limit for inputs read whole into memory (a corpus, a prompt file, a trace, a JSON or
/// TOML file): anything larger is refused with the file and the limit named, before any
/// buffer is sized from it. Mapped weight files have none (they are never copied).
constexpr uint64_t kMaxInputBytes = uint64_t(256) << 20;

/// "a FIFO", "a directory", "a character device", ... for st_mode; "a regular file" for one.
const char* file_type_name(unsigned mode);

/// A regular file opened for reading. Throws arbiter::Error naming the path:
///   "[component] PATH: cannot open (No such file or directory)"
///   "[component] PATH: is a FIFO (expected a regular file)"
/// The descriptor stays open (and the file registered as an input) until destruction.
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& component);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  /// The whole file; refuses one larger than max_bytes ("[component] PATH: 300000000 bytes,
  /// over the 268435456-byte limit for a corpus"). `what` names the kind of input.
  std::string read_all(uint64_t max_bytes, const char* what);
  /// Exactly n bytes at offset; throws "[component] PATH: read of n bytes at offset o failed".
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  std::string path_, component_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// InputFile(path, component).read_all(max_bytes, what).
std::string read_input_file(const std::string& path, const std::string& component,
                            uint64_t max_bytes, const char* what);

/// Refuses to replace path with an output when it exists and is not a regular file
/// ("[component] PATH: is a character device; refusing to replace it with an output") or is
/// the same file (device and inode) as an input open in this process ("[component] PATH: is
/// the input corpus.txt; refusing to overwrite it").
void check_output_target(const std::string& path, const std::string& component);

}  // namespace arbiter
