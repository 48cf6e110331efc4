// The renderer of the Jinja subset (tokenizer/jinja.h), shared by its two halves:
// jinja_eval.cpp (statements, expressions, operators, the budgets) and jinja_library.cpp
// (the str/dict methods, filters and tests). Private to tokenizer/.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iterator>
#include <map>
#include <unordered_map>

#include "tokenizer/jinja_ast.h"

namespace arbiter::jinja {

using K = Value::Kind;
enum class Flow { Normal, Break, Continue };

inline bool is_number(const Value& v) { return v.kind == K::Int || v.kind == K::Float || v.kind == K::Bool; }
inline double as_double(const Value& v) { return v.kind == K::Float ? v.f : double(v.kind == K::Bool ? v.b : v.i); }
inline int64_t as_int(const Value& v) { return v.kind == K::Bool ? v.b : v.i; }

// Bytes of the UTF-8 code point that starts with c (1 for a stray continuation byte).
inline size_t cp_len(unsigned char c) { return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

inline size_t cp_count(const std::string& s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); k += cp_len((unsigned char)s[k])) ++n;
  return n;
}

// s.find(needle, from) in linear time: glibc's memmem is two-way, where std::string::find
// is O(size * needle size), minutes for a hostile 32 MiB needle.
inline size_t find_sub(const std::string& s, const std::string& needle, size_t from = 0) {
  if (from > s.size()) return std::string::npos;
  const void* p = memmem(s.data() + from, s.size() - from, needle.data(), needle.size());
  return p ? size_t(static_cast<const char*>(p) - s.data()) : std::string::npos;
}

inline std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  const std::string set = chars.kind == K::String ? chars.s : std::string(" \t\n\r\f\v");
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && set.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

class Renderer {
 public:
  Renderer(const std::string& name, const Dict& globals) : name_(name) {
    frames_.emplace_back();
    for (const auto& [k, v] : globals.items) frames_.back()[k] = v;
    auto& g = frames_.back();
    if (!g.count("raise_exception"))
      g["raise_exception"] = Value::function([](CallArgs& a) -> Value { throw RaiseError(a.get(0, "message").str()); });
    if (!g.count("namespace"))
      g["namespace"] = Value::function([](CallArgs& a) {
        Dict d;
        for (const Value& p : a.pos)
          if (p.kind == K::Dict)
            for (const auto& [k, v] : p.dict->items) d.set(k, v);
        for (const auto& [k, v] : a.kw) d.set(k, v);
        Value ns = Value::make_dict(std::move(d));
        ns.is_namespace = ns.refs = true;
        return ns;
      });
    if (!g.count("range")) g["range"] = Value::function([this](CallArgs& a) { return range(a); });
    frames_.emplace_back();  // the template's own top-level variables
  }

  void run(const Node& root, std::string& out) {
    try {
      exec(root, out);
    } catch (const ValueError& e) {
      fail(e.what());
    }
  }

 private:
  const std::string& name_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  int line_ = 0;
  int depth_ = 0, macro_depth_ = 0;  // frames open; macro calls open
  int64_t steps_ = 0;
  size_t made_ = 0;  // bytes made or copied (kMaxRenderBytes)

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(strformat("[jinja] %s:%d: %s", name_.c_str(), line_, what.c_str()));
  }
  [[noreturn]] void overflow() const { fail("integer overflow (Python would make a bigint; this subset keeps to int64)"); }

  // One evaluation frame (kMaxRenderDepth) for as long as it lives.
  class Deeper {
   public:
    explicit Deeper(Renderer& r) : r_(r) {
      if (++r_.depth_ > kMaxRenderDepth)
        r_.fail("expressions, statements and macro calls nested deeper than " + std::to_string(kMaxRenderDepth));
    }
    ~Deeper() { --r_.depth_; }

   private:
    Renderer& r_;
  };

  void step(int64_t n = 1) {
    if (n > kMaxSteps - steps_) fail(strformat("template exceeded %lld steps (loop iterations, macro calls, comparisons)", (long long)kMaxSteps));
    steps_ += n;
  }
  void charge(size_t bytes) {
    if (bytes > kMaxRenderBytes - made_) fail(strformat("template made more than %zu bytes of strings and lists", kMaxRenderBytes));
    made_ += bytes;
  }
  // Checked before a string of n bytes or a list of n items is allocated.
  void need_string(size_t n) const {
    if (n > kMaxStringBytes) fail(strformat("a string of %zu bytes exceeds the %zu-byte limit", n, kMaxStringBytes));
  }
  void need_list(size_t n) {
    if (n > kMaxListItems) fail(strformat("a list of %zu items exceeds the %zu-item limit", n, kMaxListItems));
    charge(n * sizeof(Value));
  }
  Value new_list(List l) {
    need_list(l.size());
    for (const Value& v : l)
      if (v.kind == K::String) charge(v.s.size());
    return Value::make_list(std::move(l));
  }
  void append_out(std::string& out, const std::string& text) {
    if (text.size() > kMaxStringBytes - out.size())
      fail(strformat("template output exceeds %zu bytes", kMaxStringBytes));
    charge(text.size());
    out += text;
  }

  int64_t add(int64_t x, int64_t y) const {
    int64_t r;
    if (__builtin_add_overflow(x, y, &r)) overflow();
    return r;
  }
  int64_t sub(int64_t x, int64_t y) const {
    int64_t r;
    if (__builtin_sub_overflow(x, y, &r)) overflow();
    return r;
  }
  int64_t mul(int64_t x, int64_t y) const {
    int64_t r;
    if (__builtin_mul_overflow(x, y, &r)) overflow();
    return r;
  }
  // Exponentiation by squaring: 64 rounds at most whatever the exponent (e >= 0).
  int64_t ipow(int64_t base, int64_t e) const {
    int64_t r = 1;
    while (e > 0) {
      if (e & 1) r = mul(r, base);
      e >>= 1;
      if (e) base = mul(base, base);
    }
    return r;
  }
  // A decimal integer such as the digits of `x.0` or attribute="items.1".
  int64_t parse_int(const std::string& digits) const {
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) overflow();
    return v;
  }

  // The elements a value iterates over (a dict: its keys; a string: its code points), sized
  // and charged before they are copied.
  List items_of(const Value& v);

  // Python's range() made into a list, its length checked before anything is allocated.
  Value range(const CallArgs& a);

  // Python's ==; each element compared is a step.
  bool equal(const Value& x, const Value& y);

  Value lookup(const std::string& n) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      auto it = f->find(n);
      if (it != f->end()) return it->second;
    }
    return Value::undefined(n);
  }

  void need_defined(const Value& v) const {
    if (!v.defined()) fail("'" + (v.s.empty() ? std::string("value") : v.s) + "' is undefined");
  }

  // ---- statements --------------------------------------------------------------------

  Flow exec(const Node& n, std::string& out);

  Value call_macro(const Node& m, CallArgs& args);

  Flow exec_for(const Node& n, std::string& out);

  // ---- expressions -------------------------------------------------------------------

  Value eval(const Node& n) {
    Deeper deeper(*this);
    Value v = eval_node(n);
    if (v.kind == K::String) charge(v.s.size());
    return v;
  }

  Value eval_node(const Node& n);

  CallArgs eval_args(const Node& n) {
    CallArgs args;
    for (size_t k = 1; k < n.a.size(); ++k) args.pos.push_back(eval(*n.a[k]));
    for (size_t k = 0; k < n.kwnames.size(); ++k) args.kw.emplace_back(n.kwnames[k], eval(*n.kwvalues[k]));
    return args;
  }

  Value binary(const Node& n);

  bool contains(const Value& hay, const Value& needle);

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value get_item(const Value& obj, const Value& key);

  Value get_attr(const Value& obj, const std::string& name) {
    need_defined(obj);
    if (!name.empty() && std::isdigit((unsigned char)name[0])) return get_item(obj, Value::integer(parse_int(name)));
    return get_attr_or_item(obj, name, true);
  }

  // jinja2: obj.name tries the Python attribute (a method) first, then the item; obj['name']
  // tries the item first. Dicts here have no attributes but their methods.
  Value get_attr_or_item(const Value& obj, const std::string& name, bool attr_first);

  Value slice(const Node& n);

  // ---- methods -----------------------------------------------------------------------

  Value method(const Value& obj, const std::string& name);

  Value split(const std::string& s, const Value& sep, const Value& maxsplit, bool from_right);

  std::string replace(const std::string& s, const Value& from, const Value& to, const Value& count);

  static std::string capitalize(const std::string& s) {
    std::string r = s;
    for (size_t k = 0; k < r.size(); ++k) r[k] = char(k ? std::tolower((unsigned char)r[k]) : std::toupper((unsigned char)r[k]));
    return r;
  }

  static std::string title(const std::string& s) {
    std::string r = s;
    bool prev_alpha = false;
    for (char& c : r) {
      const bool alpha = std::isalpha((unsigned char)c);
      c = char(alpha && !prev_alpha ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      prev_alpha = alpha;
    }
    return r;
  }

  std::string join(const Value& seq, const std::string& sep, const Value& attr = Value::undefined());

  // `attribute="a.b"` of map/selectattr/join/sort: a dotted path of items.
  Value get_attr_path(const Value& v, const Value& attr);

  // ---- filters -----------------------------------------------------------------------

  Value filter(const std::string& f, const Value& x, CallArgs& a);

  std::string indent(const std::string& s, const CallArgs& a);

  Value map(const Value& x, CallArgs& a);

  Value select(const std::string& f, const Value& x, CallArgs& a);

  // ---- tests -------------------------------------------------------------------------

  bool test(const std::string& t, const Value& x, CallArgs& a);
};

}  // namespace arbiter::jinja
