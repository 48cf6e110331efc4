#include "cli/command.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace arbiter::cli {

std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> table;
  return table;
}

static std::vector<std::string> split_alias(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == '|') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

static std::string strip_dashes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && s[i] == '-') ++i;
  return s.substr(i);
}

Args::Args(std::string command, std::vector<std::string> value_opts,
           std::vector<std::string> flag_opts)
    : command_(std::move(command)) {
  for (auto* list : {&value_opts, &flag_opts}) {
    for (const auto& spec : *list) {
      auto names = split_alias(spec);
      std::string key = strip_dashes(names.back());
      for (const auto& n : names) alias_[n] = key;
      if (list == &flag_opts) flag_keys_.insert(key);
    }
  }
}

std::string Args::canonical(const std::string& spelling, bool& is_flag) const {
  auto it = alias_.find(spelling);
  if (it == alias_.end())
    throw Error("[cli] " + command_ + ": unknown option '" + spelling + "' (see --help)");
  is_flag = flag_keys_.count(it->second) != 0;
  return it->second;
}

void Args::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
      std::string value;
      bool has_inline = false;
      size_t eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
      bool is_flag = false;
      std::string key = canonical(a, is_flag);
      if (is_flag) {
        if (has_inline) throw Error("[cli] " + command_ + ": option '" + a + "' takes no value");
        flags_.insert(key);
        continue;
      }
      if (!has_inline) {
        if (i + 1 >= argc) throw Error("[cli] " + command_ + ": option '" + a + "' needs a value");
        value = argv[++i];
      }
      values_[key].push_back(value);
    } else {
      positional_.push_back(a);
    }
  }
}

bool Args::has(const std::string& key) const { return values_.count(key) != 0; }

std::string Args::str(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw Error("[cli] " + command_ + ": missing required option --" + key);
  return it->second.back();
}

std::string Args::str(const std::string& key, const std::string& dflt) const {
  return has(key) ? str(key) : dflt;
}

std::vector<std::string> Args::all(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::integer(const std::string& key) const { return parse_int(str(key), "--" + key); }
int64_t Args::integer(const std::string& key, int64_t dflt) const {
  return has(key) ? integer(key) : dflt;
}
int Args::int_in(const std::string& key, int64_t lo, int64_t hi) const {
  const int64_t v = integer(key);
  if (v < lo || v > hi)
    throw Error(strformat("[cli] %s: --%s %lld is outside [%lld, %lld]", command_.c_str(), key.c_str(),
                          (long long)v, (long long)lo, (long long)hi));
  return int(v);
}
int Args::int_in(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const {
  return has(key) ? int_in(key, lo, hi) : int(dflt);
}
double Args::number(const std::string& key) const { return parse_number(str(key), "--" + key); }
double Args::number(const std::string& key, double dflt) const {
  return has(key) ? number(key) : dflt;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw Error("[cli] " + what + ": '" + s + "' is not a whole number");
  return v;
}

double parse_number(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw Error("[cli] " + what + ": '" + s + "' is not a finite number");
  return v;
}

}  // namespace arbiter::cli
