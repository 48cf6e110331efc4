// Subcommand registry and a strict argument parser shared by every subcommand.
// Each subcommand lives in cmd_<name>.cpp and registers itself with REGISTER_COMMAND.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace arbiter::cli {

/// Parsed arguments. Options are declared up front; anything undeclared, a missing value,
/// or a value that is not a whole number / finite number where one is expected is an
/// error (no silent defaults).
class Args {
 public:
  /// value_opts: options taking a value ("-m", "--model"); flag_opts: boolean switches.
  /// Aliases are written "-m|--model"; the last spelling is the canonical key.
  Args(std::string command, std::vector<std::string> value_opts,
       std::vector<std::string> flag_opts);
  /// Throws arbiter::Error("[cli] <command>: ...") on bad arguments.
  void parse(int argc, char** argv);

  bool has(const std::string& key) const;
  bool flag(const std::string& key) const { return flags_.count(key) != 0; }
  std::string str(const std::string& key) const;  // required
  std::string str(const std::string& key, const std::string& dflt) const;
  /// All values of a repeatable option, in order.
  std::vector<std::string> all(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t dflt) const;
  /// A whole number in [lo, hi] (hi at most INT32_MAX), so that a count never wraps when it
  /// becomes an int: "[cli] trace: --chunk 4294967297 is outside [1, 2147483647]".
  int int_in(const std::string& key, int64_t lo, int64_t hi) const;
  int int_in(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const;
  double number(const std::string& key) const;
  double number(const std::string& key, double dflt) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string canonical(const std::string& spelling, bool& is_flag) const;
  std::string command_;
  std::map<std::string, std::string> alias_;  // spelling -> canonical key
  std::set<std::string> flag_keys_;
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

/// Parses a whole decimal number (optionally signed); throws naming what.
int64_t parse_int(const std::string& s, const std::string& what);
/// Parses a finite decimal number; throws naming what.
double parse_number(const std::string& s, const std::string& what);

using CommandFn = std::function<int(int argc, char** argv)>;
struct Command {
  std::string name, summary;
  CommandFn fn;
};
std::map<std::string, Command>& commands();

struct CommandRegistrar {
  CommandRegistrar(const std::string& name, const std::string& summary, CommandFn fn) {
    commands()[name] = Command{name, summary, std::move(fn)};
  }
};

}  // namespace arbiter::cli

#define REGISTER_COMMAND(name, summary, fn) \
  static ::arbiter::cli::CommandRegistrar arbiter_cmd_registrar_##fn(name, summary, fn)
