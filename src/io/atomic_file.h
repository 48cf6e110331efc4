// Atomic file output: bytes go to PATH.tmp.<pid> and commit() flushes, fsyncs and renames
// the temporary onto PATH, so a reader finds the complete file or none. Every file arbiter
// writes goes through it (traces, full-logits files, GGUF and safetensors files, store
// files, reports, plots).
//
// Outputs never destroy (docs/reliability.md):
//   - an existing PATH that is not a regular file (a device, a FIFO, a directory) is refused,
//     and so is a PATH that is one of this process's open inputs (io/file.h) or the target of
//     another AtomicFile still open: checked at open() and again at commit();
//   - the temporary is created with O_EXCL | O_NOFOLLOW, so a file or symlink planted at its
//     name is never written through;
//   - on SIGINT, SIGTERM or SIGHUP the open temporaries are unlinked (async-signal-safe)
//     before the signal takes its course;
//   - open() removes PATH.tmp.<pid> files left by processes that no longer exist (a SIGKILL
//     or a crash), so they do not pile up; a live process's temporary is left alone.
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
  /// Throws arbiter::Error "[component] PATH: is a FIFO; refusing to replace it with an
  /// output", "... is the input X; refusing to overwrite it", "[component] TMP: cannot create
  /// (reason)".
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
  int slot_ = -1;  // this temporary's entry in the signal handler's table
  std::string path_, tmp_path_, component_;
};

/// path made absolute, with symlinks and "." / ".." resolved as far as it exists: two
/// outputs with the same canonical path are one file.
std::string canonical_output_path(const std::string& path);

/// Removes DIR/PREFIX<pid> entries whose process no longer exists (killed, crashed): regular
/// files, and with `directories` whole directory trees (synth's temporary checkpoints). A pid
/// that exists, or that belongs to another user (EPERM), may be a run in progress: kept.
void remove_dead_process_entries(const std::string& dir, const std::string& prefix, bool directories);

/// The <pid> of an AtomicFile temporary's file name ("NAME.tmp.<pid>"), or 0 when filename
/// is not one: for directory scans that must not take a temporary for a finished file.
long atomic_temp_pid(const std::string& filename);

/// Writes data to path through an AtomicFile (open, write, commit).
void write_file_atomic(const std::string& path, const std::string& data, const std::string& component);

}  // namespace arbiter
