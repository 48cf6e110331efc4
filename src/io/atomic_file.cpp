#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "io/file.h"

namespace arbiter {

namespace {

// The temporaries the signal handler removes. The handler may only touch async-signal-safe
// state, so each entry is a fixed buffer guarded by an atomic state: kFree -> kBusy (being
// filled or cleared by its owner) -> kLive (the handler unlinks it) -> kBusy -> kFree.
constexpr int kSlots = 64;
constexpr int kFree = 0, kBusy = 1, kLive = 2;
struct TempSlot {
  std::atomic<int> state{kFree};
  char path[4096];
};
TempSlot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

// Targets of the open AtomicFiles (canonical paths), so that two outputs of one run cannot
// name the same file (the later rename would destroy the earlier output). Not read by the
// handler, so a mutex is fine.
std::mutex g_targets_mutex;
std::string g_targets[kSlots];

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];

extern "C" void remove_temporaries_on_signal(int sig) {
  for (TempSlot& s : g_slots)
    if (s.state.load() == kLive) ::unlink(s.path);
  // Give the signal its previous action and raise it again: it is delivered as soon as this
  // handler returns (it is blocked until then), so the exit status still says "killed by".
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  ::raise(sig);
}

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
      ::sigaction(kSignals[i], nullptr, &g_previous[i]);
      if (g_previous[i].sa_handler == SIG_IGN) continue;  // e.g. SIGHUP under nohup: keep ignoring
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_handler = remove_temporaries_on_signal;
      sigfillset(&sa.sa_mask);
      ::sigaction(kSignals[i], &sa, nullptr);
    }
  });
}

}  // namespace

std::string canonical_output_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? path : p.string();
}

namespace {

// Claims a slot for tmp (and its target); -1 when the table is full.
int claim_slot(const std::string& tmp, const std::string& target) {
  if (tmp.size() >= sizeof(g_slots[0].path)) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kBusy)) continue;
    std::memcpy(g_slots[i].path, tmp.c_str(), tmp.size() + 1);
    {
      std::lock_guard<std::mutex> lock(g_targets_mutex);
      g_targets[i] = target;
    }
    g_slots[i].state.store(kLive);
    return i;
  }
  return -1;
}

void release_slot(int i) {
  if (i < 0) return;
  g_slots[i].state.store(kBusy);
  {
    std::lock_guard<std::mutex> lock(g_targets_mutex);
    g_targets[i].clear();
  }
  g_slots[i].state.store(kFree);
}

bool target_open(const std::string& target) {
  std::lock_guard<std::mutex> lock(g_targets_mutex);
  for (const std::string& t : g_targets)
    if (!t.empty() && t == target) return true;
  return false;
}

}  // namespace

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
  release_slot(slot_);
  slot_ = -1;
}

void AtomicFile::fail(const std::string& what, int err) {
  discard();
  throw Error(component_ + " " + what + " (" + std::strerror(err) + ")");
}

void AtomicFile::open(const std::string& path, const std::string& component) {
  ARB_CHECK(!f_, "%s %s: file already open on %s", component.c_str(), path.c_str(), path_.c_str());
  check_output_target(path, component);
  const std::string target = canonical_output_path(path);
  ARB_CHECK(!target_open(target), "%s %s: is already an output of this run; refusing to write it twice",
            component.c_str(), path.c_str());
  install_signal_handlers();
  {
    const std::filesystem::path p(path);
    remove_dead_process_entries(p.has_parent_path() ? p.parent_path().string() : ".", p.filename().string() + ".tmp.",
                                false);
  }
  component_ = component;
  path_ = path;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  // Registered before it exists, so that a signal arriving right after the file is created
  // still finds it (unlinking a name not yet created is harmless).
  slot_ = claim_slot(tmp, target);
  if (slot_ < 0) throw Error(component_ + " " + path + ": more than 64 outputs open at once");
  // O_EXCL | O_NOFOLLOW: never write through a file or symlink someone put at this name. One
  // there already carries our pid, so it is a leftover of an earlier process with that pid.
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0)
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int err = errno;
    release_slot(slot_);
    slot_ = -1;
    throw Error(component_ + " " + tmp + ": cannot create (" + std::strerror(err) + ")");
  }
  tmp_path_ = tmp;
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    int err = errno;
    ::close(fd);
    fail(tmp + ": cannot create", err);
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
  // What is at the target now may differ from what was there at open() (an input opened
  // since, a FIFO made meanwhile): checked again right before the rename.
  try {
    check_output_target(path_, component_);
  } catch (const Error&) {
    discard();
    throw;
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) fail(path_ + ": cannot complete", errno);
  tmp_path_.clear();
  release_slot(slot_);
  slot_ = -1;
}

void remove_dead_process_entries(const std::string& dir, const std::string& prefix, bool directories) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;  // the caller reports an unusable directory itself
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      continue;
    const pid_t pid = pid_t(std::stol(name.substr(prefix.size())));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string stale = dir + "/" + name;
    struct stat st;
    if (::lstat(stale.c_str(), &st) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      ::unlink(stale.c_str());
    } else if (directories && S_ISDIR(st.st_mode)) {
      std::error_code ec;
      std::filesystem::remove_all(stale, ec);
    }
  }
  ::closedir(d);
}

long atomic_temp_pid(const std::string& filename) {
  const size_t at = filename.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return 0;
  const std::string digits = filename.substr(at + 5);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(digits);
}

void write_file_atomic(const std::string& path, const std::string& data, const std::string& component) {
  AtomicFile f;
  f.open(path, component);
  f.write(data);
  f.commit();
}

}  // namespace arbiter
