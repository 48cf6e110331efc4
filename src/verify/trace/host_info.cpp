#include "verify/trace/host_info.h"

#include <unistd.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

namespace arbiter::verify {

namespace {

std::string clean(std::string s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r\n");
  s = a == std::string::npos ? "" : s.substr(a, b - a + 1);
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

// The value after "key : " on the first line of path that starts with key, or "".
std::string line_value(const std::string& path, const std::string& key, char sep) {
  std::ifstream f(path);
  for (std::string ln; std::getline(f, ln);)
    if (ln.rfind(key, 0) == 0 && ln.find(sep) != std::string::npos)
      return clean(ln.substr(ln.find(sep) + 1));
  return "";
}

}  // namespace

std::string nvidia_driver_version(const std::string& nvrm) {
  std::istringstream in(nvrm);
  for (std::string w; in >> w;)
    if (w.find('.') != std::string::npos && std::isdigit((unsigned char)w[0]) &&
        w.find_first_not_of("0123456789.") == std::string::npos)
      return w;
  return "";
}

std::vector<std::pair<std::string, std::string>> host_header_lines() {
  std::vector<std::pair<std::string, std::string>> out;
  char hn[256] = {0};
  out.emplace_back("host", ::gethostname(hn, sizeof hn - 1) == 0 && hn[0] ? clean(hn) : "unknown");
  std::string cpu = line_value("/proc/cpuinfo", "model name", ':');
  out.emplace_back("cpu", cpu.empty() ? "unknown" : cpu);
  std::string nv =
      nvidia_driver_version(line_value("/proc/driver/nvidia/version", "NVRM version", ':'));
  if (!nv.empty()) out.emplace_back("driver", "nvidia-" + nv);
  return out;
}

}  // namespace arbiter::verify
