// A Jinja2 subset, enough to render the chat templates that models ship (HF
// tokenizer_config.json / chat_template.jinja, GGUF tokenizer.chat_template) byte for byte
// as HF transformers renders them: its environment has trim_blocks and lstrip_blocks on,
// the loopcontrols extension, raise_exception(), strftime_now() and a tojson that is
// Python's json.dumps (ensure_ascii=False, insertion key order).
//
// Supported: {{ }}, {% %}, {# #} with '-' / '+' whitespace control; if/elif/else, for
// (tuple targets, 'if' filter, else, loop.*), set (incl. namespace attributes and
// {% set %}...{% endset %}), macro, break/continue, generation (rendered as its body);
// Python-like values, operators, slicing, the common filters, tests and str/dict methods.
// Anything else is refused when the template is parsed or when the construct is reached,
// with an Error naming the template and line, never rendered differently.
//
// Templates come from model files and the server renders them per request, so every
// resource a template can consume is bounded (the limits below); past one, parsing or
// rendering fails with the Error naming the limit, never with a stack overflow, a hang or an
// allocation failure. Integers are int64 and an overflow fails ("integer overflow") where
// Python would go on with a bigint.
//
// Tests: tests/tokenizer/chat_template_test.cpp compares against Python jinja2 renderings
// (tools/chat_goldens.py); add a construct there when a new template needs it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace arbiter::jinja {

// Destroying and evaluating the syntax tree recurse, once per level, so the parser bounds its
// height (as jinja_parse.cpp counts it, the templates in tests/fixtures reach 21 to 24).
constexpr int kMaxNesting = 256;
// Evaluation frames (expressions, statements, macro bodies) open at once: macros multiply
// the tree's height. A render at this bound ran inside an 8 MiB stack under ASan.
constexpr int kMaxRenderDepth = 1024;
// Recursive macros are legal (tool-schema templates walk a JSON schema, whose nesting the
// request parser already bounds to 64).
constexpr int kMaxMacroDepth = 100;
// Loop iterations, macro calls and element comparisons (==, in) in one render; the real
// templates loop over the messages once or twice with a handful of comparisons each. At
// 1,000,000 a loop ran past the fuzz harness's 10 s under ASan (~10 us per iteration there).
constexpr int64_t kMaxSteps = 250000;
// Any one string a render makes (its output included), and any one list.
constexpr size_t kMaxStringBytes = size_t(64) << 20;
constexpr size_t kMaxListItems = size_t(1) << 20;
// Everything one render makes or copies: string bytes, and sizeof(Value) per list item.
constexpr size_t kMaxRenderBytes = size_t(256) << 20;
// Lists and dicts nested in a value: copying, printing and destroying one recurse per level.
constexpr int kMaxValueDepth = 128;

/// Thrown by the template's own raise_exception(msg): what() is msg alone (the server
/// returns it to the client as a 400).
class RaiseError : public Error {
 public:
  explicit RaiseError(const std::string& msg) : Error(msg) {}
};

/// Thrown by the value functions (Value::str, to_json, make_list ...) when a limit above is
/// passed; the renderer rethrows it as "[jinja] NAME:LINE: what".
class ValueError : public Error {
 public:
  explicit ValueError(const std::string& what) : Error(what) {}
};

struct Value;
using List = std::vector<Value>;
/// Insertion-ordered string-keyed map (JSON objects keep their order, as in Python).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& k) const;
  void set(const std::string& k, Value v);
};
struct CallArgs;
using Func = std::function<Value(CallArgs&)>;

/// A Python-like value. Lists and dicts are shared (reference semantics, as in Python);
/// a namespace() is a dict whose attributes may be assigned.
struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Func };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, the name that was looked up (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> fn;
  bool is_namespace = false;
  // Lists and dicts nested inside (0 for a scalar; a namespace counts 1 whatever it holds).
  int depth = 0;
  // Holds a namespace or a function, so storing it in a namespace could make a cycle.
  bool refs = false;

  static Value undefined(std::string name = "") { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  /// Throw ValueError past kMaxValueDepth.
  static Value make_list(List x = {});
  static Value make_dict(Dict x = {});
  static Value function(Func f);
  /// From JSON (objects keep their key order when given an ordered_json).
  static Value from_json(const nlohmann::ordered_json& j);

  bool defined() const { return kind != Kind::Undefined; }
  bool truthy() const;
  /// Python's str(): "None", "True", "1.5", "['a', 1]"; Undefined gives "". Throws
  /// ValueError when the text would pass max_bytes.
  std::string str(size_t max_bytes = kMaxStringBytes) const;
  /// Python's repr() ('a' quoted).
  std::string repr(size_t max_bytes = kMaxStringBytes) const;
  const char* type_name() const;
};

/// Python's json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with the
/// default separators (", " / ": "; "," / ": " when indented). indent < 0: none. Throws
/// ValueError when the text would pass max_bytes.
std::string to_json(const Value& v, int64_t indent = -1, bool sort_keys = false,
                    size_t max_bytes = kMaxStringBytes);
/// Python's float repr ("1.0", "0.1", "1e-05").
std::string python_float(double x);

/// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::string what;  // "filter 'join'" etc., for messages
  /// The n-th argument (positional, else keyword `name`), or Undefined.
  Value get(size_t n, const std::string& name) const;
};

struct Node;

/// A parsed template. Parsing throws arbiter::Error "[jinja] NAME:LINE: what".
class Template {
 public:
  Template(const std::string& source, const std::string& name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  /// Renders with the given global variables. Throws RaiseError for raise_exception() and
  /// arbiter::Error "[jinja] NAME:LINE: what" for any other failure (an undefined value
  /// used in an operation, a wrong type, an unsupported filter or method).
  std::string render(const Dict& globals) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<Node> root_;
};

}  // namespace arbiter::jinja
