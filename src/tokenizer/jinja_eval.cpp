// Evaluator of the Jinja subset (tokenizer/jinja.h): scopes as jinja2 has them (a for loop
// body and a macro get their own frame per run; if does not), Python semantics for
// operators, and the filters, tests and str/dict methods that chat templates use. Where
// Python would raise (an undefined value in arithmetic, 'a' + None), this raises too, so a
// template never renders text that transformers would refuse.
//
// Budgets (jinja.h): every string an expression evaluates to is charged its bytes when the
// expression returns (so a copy out of a variable costs what the bytes cost to move), every
// list made is charged sizeof(Value) per item, and ops that make a string or a list compute
// its size and check it against kMaxStringBytes / kMaxListItems before allocating it. Loop
// iterations, macro calls and element comparisons count as steps.
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
namespace {

using K = Value::Kind;
enum class Flow { Normal, Break, Continue };

bool is_number(const Value& v) { return v.kind == K::Int || v.kind == K::Float || v.kind == K::Bool; }
double as_double(const Value& v) { return v.kind == K::Float ? v.f : double(v.kind == K::Bool ? v.b : v.i); }
int64_t as_int(const Value& v) { return v.kind == K::Bool ? v.b : v.i; }

// Bytes of the UTF-8 code point that starts with c (1 for a stray continuation byte).
size_t cp_len(unsigned char c) { return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

size_t cp_count(const std::string& s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); k += cp_len((unsigned char)s[k])) ++n;
  return n;
}

// s.find(needle, from) in linear time: glibc's memmem is two-way, where std::string::find
// is O(size * needle size), minutes for a hostile 32 MiB needle.
size_t find_sub(const std::string& s, const std::string& needle, size_t from = 0) {
  if (from > s.size()) return std::string::npos;
  const void* p = memmem(s.data() + from, s.size() - from, needle.data(), needle.size());
  return p ? size_t(static_cast<const char*>(p) - s.data()) : std::string::npos;
}

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
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
  List items_of(const Value& v) {
    switch (v.kind) {
      case K::Undefined: return {};
      case K::List: {
        need_list(v.list->size());
        for (const Value& e : *v.list)
          if (e.kind == K::String) charge(e.s.size());
        return *v.list;
      }
      case K::Dict: {
        if (v.is_namespace) fail("a namespace is not iterable");
        need_list(v.dict->items.size());
        List out;
        for (const auto& [k, x] : v.dict->items) {
          charge(k.size());
          out.push_back(Value::string(k));
        }
        return out;
      }
      case K::String: {
        need_list(cp_count(v.s));
        charge(v.s.size());
        List out;
        for (size_t k = 0; k < v.s.size();) {
          const size_t n = cp_len((unsigned char)v.s[k]);
          out.push_back(Value::string(v.s.substr(k, n)));
          k += n;
        }
        return out;
      }
      default: fail(std::string("'") + v.type_name() + "' object is not iterable");
    }
  }

  // Python's range() made into a list, its length checked before anything is allocated.
  Value range(const CallArgs& a) {
    if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 integer arguments");
    for (const Value& v : a.pos)
      if (v.kind != K::Int && v.kind != K::Bool) fail(std::string("range() arguments must be integers, got '") + v.type_name() + "'");
    const int64_t first = a.pos.size() == 1 ? 0 : as_int(a.pos[0]);
    const int64_t stop = as_int(a.pos[a.pos.size() == 1 ? 0 : 1]);
    const int64_t by = a.pos.size() == 3 ? as_int(a.pos[2]) : 1;
    if (by == 0) fail("range() arg 3 must not be zero");
    // The count in 128 bits: stop - first and the rounding overflow int64 at the extremes.
    const __int128 span = by > 0 ? __int128(stop) - first : __int128(first) - stop;
    const __int128 mag = by > 0 ? __int128(by) : -__int128(by);
    const __int128 count = span <= 0 ? 0 : (span + mag - 1) / mag;
    need_list(size_t(count));  // at most 2^64 - 1
    List l;
    l.reserve(size_t(count));
    for (__int128 k = 0; k < count; ++k) l.push_back(Value::integer(int64_t(first + k * by)));
    return Value::make_list(std::move(l));
  }

  // Python's ==; each element compared is a step.
  bool equal(const Value& x, const Value& y) {
    step();
    if (is_number(x) && is_number(y)) {
      if (x.kind == K::Float || y.kind == K::Float) return as_double(x) == as_double(y);
      return as_int(x) == as_int(y);
    }
    if (x.kind != y.kind) return false;
    switch (x.kind) {
      case K::Undefined:
      case K::None: return true;
      case K::String: return x.s == y.s;
      case K::List:
        if (x.list->size() != y.list->size()) return false;
        for (size_t k = 0; k < x.list->size(); ++k)
          if (!equal((*x.list)[k], (*y.list)[k])) return false;
        return true;
      case K::Dict:
        if (x.is_namespace || y.is_namespace) return x.dict == y.dict;
        if (x.dict->items.size() != y.dict->items.size()) return false;
        for (const auto& [k, v] : x.dict->items) {
          step(int64_t(y.dict->items.size()));  // the linear find
          const Value* o = y.dict->find(k);
          if (!o || !equal(v, *o)) return false;
        }
        return true;
      case K::Func: return x.fn == y.fn;
      default: return false;
    }
  }

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

  Flow exec(const Node& n, std::string& out) {
    Deeper deeper(*this);
    line_ = n.line;
    switch (n.kind) {
      case Node::Kind::Block:
        for (const auto& c : n.a) {
          Flow f = exec(*c, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case Node::Kind::Text: append_out(out, n.name); return Flow::Normal;
      case Node::Kind::Output: append_out(out, eval(*n.a[0]).str()); return Flow::Normal;
      case Node::Kind::If:
        for (size_t k = 0; k < n.a.size(); ++k)
          if (eval(*n.a[k]).truthy()) return exec(*n.b[k], out);
        if (n.b.size() > n.a.size()) return exec(*n.b.back(), out);
        return Flow::Normal;
      case Node::Kind::For: return exec_for(n, out);
      case Node::Kind::Set: {
        Value v = eval(*n.a[0]);
        if (!n.name.empty()) {
          Value ns = lookup(n.names[0]);
          if (ns.kind != K::Dict || !ns.is_namespace)
            fail("cannot assign attribute '" + n.name + "' on '" + n.names[0] + "' (not a namespace)");
          // What a namespace holds outlives the loop body, so this is where a value could
          // grow without bound or point back at the namespace.
          if (v.refs) fail("a namespace attribute cannot hold a namespace or a function in this Jinja subset");
          if (v.depth >= kMaxValueDepth)
            fail("values nested deeper than " + std::to_string(kMaxValueDepth) + " lists/dicts");
          step(int64_t(ns.dict->items.size()));  // the linear find
          ns.dict->set(n.name, std::move(v));
        } else if (n.names.size() == 1) {
          frames_.back()[n.names[0]] = std::move(v);
        } else {
          List items = items_of(v);
          if (items.size() != n.names.size())
            fail(strformat("cannot unpack %zu values into %zu names", items.size(), n.names.size()));
          for (size_t k = 0; k < items.size(); ++k) frames_.back()[n.names[k]] = items[k];
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string body;
        exec(*n.b[0], body);
        frames_.back()[n.names[0]] = Value::string(body);
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        const Node* mn = &n;
        frames_.back()[n.name] = Value::function([this, mn](CallArgs& args) { return call_macro(*mn, args); });
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      default: fail("not a statement");
    }
  }

  Value call_macro(const Node& m, CallArgs& args) {
    step();
    if (macro_depth_ >= kMaxMacroDepth) fail("macro recursion deeper than " + std::to_string(kMaxMacroDepth));
    if (args.pos.size() > m.names.size()) fail("macro '" + m.name + "' takes " + std::to_string(m.names.size()) + " arguments");
    std::unordered_map<std::string, Value> frame;
    for (size_t k = 0; k < m.names.size(); ++k) {
      Value v = args.get(k, m.names[k]);
      if (!v.defined() && m.a[k]) v = eval(*m.a[k]);
      frame[m.names[k]] = v;
    }
    // The macro sees the globals and the template's top-level names, not the caller's (moved
    // aside, not copied: a call must not cost the size of the caller's variables).
    std::vector<std::unordered_map<std::string, Value>> saved(std::make_move_iterator(frames_.begin() + 2),
                                                              std::make_move_iterator(frames_.end()));
    frames_.resize(2);
    frames_.push_back(std::move(frame));
    auto restore = [&] {
      frames_.resize(2);
      frames_.insert(frames_.end(), std::make_move_iterator(saved.begin()), std::make_move_iterator(saved.end()));
      --macro_depth_;
    };
    ++macro_depth_;
    std::string body;
    const int line = line_;
    try {
      exec(*m.b[0], body);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    line_ = line;
    return Value::string(body);
  }

  Flow exec_for(const Node& n, std::string& out) {
    List items = items_of(eval(*n.a[0]));
    auto bind = [&](std::unordered_map<std::string, Value>& f, const Value& item) {
      if (n.names.size() == 1) {
        f[n.names[0]] = item;
        return;
      }
      List parts = items_of(item);
      if (parts.size() != n.names.size())
        fail(strformat("cannot unpack %zu values into %zu loop variables", parts.size(), n.names.size()));
      for (size_t k = 0; k < parts.size(); ++k) f[n.names[k]] = parts[k];
    };
    if (n.a[1]) {  // `for x in xs if cond`: loop.* counts the kept items only
      List kept;
      for (const Value& it : items) {
        step();
        frames_.emplace_back();
        bind(frames_.back(), it);
        bool keep = eval(*n.a[1]).truthy();
        frames_.pop_back();
        if (keep) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.b.size() > 1) return exec(*n.b[1], out);
      return Flow::Normal;
    }
    const int64_t len = int64_t(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step();
      Dict loop;  // distinct keys: appended, not set (set's search made up much of a step)
      loop.items = {{"index0", Value::integer(k)},
                    {"index", Value::integer(k + 1)},
                    {"revindex0", Value::integer(len - k - 1)},
                    {"revindex", Value::integer(len - k)},
                    {"first", Value::boolean(k == 0)},
                    {"last", Value::boolean(k == len - 1)},
                    {"length", Value::integer(len)},
                    {"previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem")},
                    {"nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("nextitem")}};
      frames_.emplace_back();
      frames_.back()["loop"] = Value::make_dict(std::move(loop));
      bind(frames_.back(), items[size_t(k)]);
      Flow f;
      try {
        f = exec(*n.b[0], out);
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // ---- expressions -------------------------------------------------------------------

  Value eval(const Node& n) {
    Deeper deeper(*this);
    Value v = eval_node(n);
    if (v.kind == K::String) charge(v.s.size());
    return v;
  }

  Value eval_node(const Node& n) {
    line_ = n.line;
    switch (n.kind) {
      case Node::Kind::Literal: return n.value;
      case Node::Kind::Name: return lookup(n.name);
      case Node::Kind::GetAttr: return get_attr(eval(*n.a[0]), n.name);
      case Node::Kind::GetItem: return get_item(eval(*n.a[0]), eval(*n.a[1]));
      case Node::Kind::Slice: return slice(n);
      case Node::Kind::Call: {
        Value f = eval(*n.a[0]);
        CallArgs args = eval_args(n);
        if (f.kind != K::Func) {
          need_defined(f);
          fail(std::string("'") + f.type_name() + "' object is not callable");
        }
        return (*f.fn)(args);
      }
      case Node::Kind::Filter: {
        Value x = eval(*n.a[0]);
        CallArgs args = eval_args(n);
        args.what = "filter '" + n.name + "'";
        return filter(n.name, x, args);
      }
      case Node::Kind::Test: {
        Value x = eval(*n.a[0]);
        CallArgs args = eval_args(n);
        bool r = test(n.name, x, args);
        return Value::boolean(n.flag ? !r : r);
      }
      case Node::Kind::Unary: {
        Value x = eval(*n.a[0]);
        if (n.name == "not") return Value::boolean(!x.truthy());
        need_defined(x);
        if (!is_number(x)) fail(std::string("bad operand type for unary ") + n.name + ": '" + x.type_name() + "'");
        if (n.name == "+") return x.kind == K::Bool ? Value::integer(x.b) : x;
        return x.kind == K::Float ? Value::number(-x.f) : Value::integer(sub(0, as_int(x)));
      }
      case Node::Kind::Binary: return binary(n);
      case Node::Kind::Cond:
        if (eval(*n.a[0]).truthy()) return eval(*n.a[1]);
        return n.a[2] ? eval(*n.a[2]) : Value::undefined();
      case Node::Kind::ListLit: {
        List l;
        for (const auto& e : n.a) l.push_back(eval(*e));
        return new_list(std::move(l));
      }
      case Node::Kind::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < n.a.size(); k += 2) {
          Value key = eval(*n.a[k]);
          if (key.kind != K::String) fail("dict keys must be strings in this Jinja subset");
          step(int64_t(d.items.size()));  // the linear find
          d.set(key.s, eval(*n.a[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
      default: fail("not an expression");
    }
  }

  CallArgs eval_args(const Node& n) {
    CallArgs args;
    for (size_t k = 1; k < n.a.size(); ++k) args.pos.push_back(eval(*n.a[k]));
    for (size_t k = 0; k < n.kwnames.size(); ++k) args.kw.emplace_back(n.kwnames[k], eval(*n.kwvalues[k]));
    return args;
  }

  Value binary(const Node& n) {
    const std::string& op = n.name;
    if (op == "and") {
      Value l = eval(*n.a[0]);
      return l.truthy() ? eval(*n.a[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*n.a[0]);
      return l.truthy() ? l : eval(*n.a[1]);
    }
    Value l = eval(*n.a[0]);
    Value r = eval(*n.a[1]);
    line_ = n.line;
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in" || op == "notin") {
      bool in = contains(r, l);
      return Value::boolean(op == "in" ? in : !in);
    }
    if (op == "~") {
      std::string x = l.str(), y = r.str();
      need_string(x.size() + y.size());
      return Value::string(x + y);
    }
    need_defined(l);
    need_defined(r);
    auto type_error = [&]() {
      fail("unsupported operand types for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
    };
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (is_number(l) && is_number(r)) c = as_double(l) < as_double(r) ? -1 : as_double(l) > as_double(r);
      else if (l.kind == K::String && r.kind == K::String) c = l.s.compare(r.s) < 0 ? -1 : l.s.compare(r.s) > 0;
      else type_error();
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (l.kind == K::String && r.kind == K::String) {
        need_string(l.s.size() + r.s.size());
        return Value::string(l.s + r.s);
      }
      if (l.kind == K::List && r.kind == K::List) {
        need_list(l.list->size() + r.list->size());
        List x = *l.list;
        x.insert(x.end(), r.list->begin(), r.list->end());
        return new_list(std::move(x));
      }
    }
    if (op == "*" && ((l.kind == K::String && r.kind == K::Int) || (l.kind == K::Int && r.kind == K::String))) {
      const Value& s = l.kind == K::String ? l : r;
      const int64_t times = l.kind == K::Int ? l.i : r.i;
      if (times <= 0 || s.s.empty()) return Value::string("");  // Python: a negative count gives ''
      if (uint64_t(times) > kMaxStringBytes / s.s.size()) need_string(kMaxStringBytes + 1);
      need_string(s.s.size() * size_t(times));
      std::string out;
      out.reserve(s.s.size() * size_t(times));
      for (int64_t k = 0; k < times; ++k) out += s.s;
      return Value::string(out);
    }
    if (!is_number(l) || !is_number(r)) type_error();
    const bool fl = l.kind == K::Float || r.kind == K::Float;
    const double a = as_double(l), b = as_double(r);
    if (op == "/") {
      if (b == 0) fail("division by zero");
      return Value::number(a / b);
    }
    if (op == "**") {
      if (!fl && as_int(r) >= 0) return Value::integer(ipow(as_int(l), as_int(r)));
      if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(a, b));
    }
    if (fl) {
      if (op == "+") return Value::number(a + b);
      if (op == "-") return Value::number(a - b);
      if (op == "*") return Value::number(a * b);
      if (b == 0) fail("division by zero");
      if (op == "//") return Value::number(std::floor(a / b));
      if (op == "%") return Value::number(a - b * std::floor(a / b));
    } else {
      const int64_t x = as_int(l), y = as_int(r);
      if (op == "+") return Value::integer(add(x, y));
      if (op == "-") return Value::integer(sub(x, y));
      if (op == "*") return Value::integer(mul(x, y));
      if (y == 0) fail("division by zero");
      if (y == -1) return Value::integer(op == "//" ? sub(0, x) : 0);  // INT64_MIN / -1 overflows
      // Python floors the quotient; the remainder takes the divisor's sign.
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;
      if (op == "//") return Value::integer(q);
      if (op == "%") return Value::integer(m);
    }
    type_error();
    return {};
  }

  bool contains(const Value& hay, const Value& needle) {
    switch (hay.kind) {
      case K::String:
        if (needle.kind != K::String) fail("'in <string>' requires a string as left operand");
        return find_sub(hay.s, needle.s) != std::string::npos;
      case K::List:
        for (const Value& v : *hay.list)
          if (equal(v, needle)) return true;
        return false;
      case K::Dict:
        step(int64_t(hay.dict->items.size()));  // the linear find
        return needle.kind == K::String && hay.dict->find(needle.s);
      case K::Undefined: need_defined(hay); return false;
      default: fail(std::string("argument of type '") + hay.type_name() + "' is not iterable");
    }
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value get_item(const Value& obj, const Value& key) {
    need_defined(obj);
    if (key.kind == K::String) return get_attr_or_item(obj, key.s, false);
    if (!is_number(key) || key.kind == K::Float) return Value::undefined();
    if (obj.kind == K::List) {
      int64_t i = norm_index(as_int(key), int64_t(obj.list->size()));
      return i >= 0 && i < int64_t(obj.list->size()) ? (*obj.list)[size_t(i)] : Value::undefined();
    }
    if (obj.kind == K::String) {
      const int64_t i = norm_index(as_int(key), as_int(key) < 0 ? int64_t(cp_count(obj.s)) : 0);
      if (i < 0) return Value::undefined();
      size_t k = 0;
      for (int64_t c = 0; c < i && k < obj.s.size(); ++c) k += cp_len((unsigned char)obj.s[k]);
      if (k >= obj.s.size()) return Value::undefined();
      return Value::string(obj.s.substr(k, cp_len((unsigned char)obj.s[k])));
    }
    return Value::undefined();
  }

  Value get_attr(const Value& obj, const std::string& name) {
    need_defined(obj);
    if (!name.empty() && std::isdigit((unsigned char)name[0])) return get_item(obj, Value::integer(parse_int(name)));
    return get_attr_or_item(obj, name, true);
  }

  // jinja2: obj.name tries the Python attribute (a method) first, then the item; obj['name']
  // tries the item first. Dicts here have no attributes but their methods.
  Value get_attr_or_item(const Value& obj, const std::string& name, bool attr_first) {
    if (obj.kind == K::Dict) {
      if (obj.is_namespace) {
        const Value* v = obj.dict->find(name);
        return v ? *v : Value::undefined(name);
      }
      if (attr_first) {
        Value m = method(obj, name);
        if (m.defined()) return m;
      }
      const Value* v = obj.dict->find(name);
      if (v) return *v;
      return attr_first ? Value::undefined(name) : method(obj, name);
    }
    return method(obj, name);
  }

  Value slice(const Node& n) {
    Value obj = eval(*n.a[0]);
    need_defined(obj);
    if (obj.kind != K::List && obj.kind != K::String)
      fail(std::string("'") + obj.type_name() + "' object is not subscriptable");
    // A string is sliced by code points: it needs their byte offsets, unless it is ASCII.
    const bool ascii = obj.kind == K::String &&
                       std::all_of(obj.s.begin(), obj.s.end(), [](char c) { return (unsigned char)c < 0x80; });
    std::vector<size_t> cps;
    if (obj.kind == K::String && !ascii) {
      const size_t count = cp_count(obj.s);
      charge((count + 1) * sizeof(size_t));
      cps.reserve(count + 1);
      for (size_t k = 0; k < obj.s.size(); k += cp_len((unsigned char)obj.s[k])) cps.push_back(k);
      cps.push_back(obj.s.size());
    }
    const int64_t len = int64_t(obj.kind == K::List ? obj.list->size() : ascii ? obj.s.size() : cps.size() - 1);
    auto part = [&](int k, bool& given) -> int64_t {
      given = false;
      if (!n.a[size_t(k)]) return 0;
      Value v = eval(*n.a[size_t(k)]);
      if (v.kind == K::None) return 0;
      if (v.kind != K::Int) fail("slice indices must be integers");
      given = true;
      return v.i;
    };
    bool hs, he, hp;
    int64_t start = part(1, hs), stop = part(2, he), step = part(3, hp);
    if (!hp) step = 1;
    if (step == 0) fail("slice step cannot be zero");
    // Python's slice.indices() (v + len cannot overflow: v < 0 <= len)
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    start = clamp(start, hs, step > 0 ? 0 : len - 1);
    stop = clamp(stop, he, step > 0 ? len : -1);
    List out;
    std::string str;
    for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
      if (obj.kind == K::List) out.push_back((*obj.list)[size_t(k)]);
      else if (ascii) str += obj.s[size_t(k)];
      else str.append(obj.s, cps[size_t(k)], std::min(cps[size_t(k) + 1], obj.s.size()) - cps[size_t(k)]);
      if (__builtin_add_overflow(k, step, &k)) break;  // a step near INT64_MAX leaves the range
    }
    if (obj.kind == K::String) return Value::string(str);
    return new_list(std::move(out));
  }

  // ---- methods -----------------------------------------------------------------------

  Value method(const Value& obj, const std::string& name) {
    auto bound = [&](std::function<Value(CallArgs&)> f) { return Value::function(std::move(f)); };
    if (obj.kind == K::String) {
      const std::string s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return bound([s, name](CallArgs& a) {
          return Value::string(strip_chars(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
        });
      if (name == "split" || name == "rsplit")
        return bound([this, s, name](CallArgs& a) { return split(s, a.get(0, "sep"), a.get(1, "maxsplit"), name == "rsplit"); });
      if (name == "startswith" || name == "endswith")
        return bound([this, s, name](CallArgs& a) {
          Value p = a.get(0, "prefix");
          List opts = p.kind == K::List ? *p.list : List{p};
          for (const Value& o : opts) {
            if (o.kind != K::String) fail(name + " first arg must be str or a tuple of str");
            if (name == "startswith" ? s.rfind(o.s, 0) == 0
                                     : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0)
              return Value::boolean(true);
          }
          return Value::boolean(false);
        });
      if (name == "upper" || name == "lower")
        return bound([s, name](CallArgs&) {
          std::string r = s;
          for (char& c : r) c = char(name == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
          return Value::string(r);
        });
      if (name == "title" || name == "capitalize")
        return bound([this, s, name](CallArgs&) { return Value::string(name == "title" ? title(s) : capitalize(s)); });
      if (name == "replace")
        return bound([this, s](CallArgs& a) { return Value::string(replace(s, a.get(0, "old"), a.get(1, "new"), a.get(2, "count"))); });
      if (name == "find")
        return bound([s](CallArgs& a) {
          Value x = a.get(0, "sub");
          size_t p = x.kind == K::String ? find_sub(s, x.s) : std::string::npos;
          return Value::integer(p == std::string::npos ? -1 : int64_t(p));
        });
      if (name == "join")
        return bound([this, s](CallArgs& a) { return Value::string(join(a.get(0, "iterable"), s)); });
      return Value::undefined(name);
    }
    if (obj.kind == K::Dict && !obj.is_namespace) {
      auto d = obj.dict;
      if (name == "items")
        return bound([this, d](CallArgs&) {
          need_list(d->items.size());
          List out;
          for (const auto& [k, v] : d->items) out.push_back(new_list({Value::string(k), v}));
          return Value::make_list(std::move(out));
        });
      if (name == "keys" || name == "values")
        return bound([this, d, name](CallArgs&) {
          List out;
          for (const auto& [k, v] : d->items) out.push_back(name == "keys" ? Value::string(k) : v);
          return new_list(std::move(out));
        });
      if (name == "get")
        return bound([this, d](CallArgs& a) {
          step(int64_t(d->items.size()));  // the linear find
          Value k = a.get(0, "key");
          const Value* v = k.kind == K::String ? d->find(k.s) : nullptr;
          if (v) return *v;
          Value dflt = a.get(1, "default");
          return dflt.defined() ? dflt : Value::none();
        });
    }
    return Value::undefined(name);
  }

  Value split(const std::string& s, const Value& sep, const Value& maxsplit, bool from_right) {
    int64_t maxn = maxsplit.kind == K::Int ? maxsplit.i : -1;
    List out;
    auto part = [&](std::string p) {
      if (out.size() >= kMaxListItems) need_list(out.size() + 1);
      out.push_back(Value::string(std::move(p)));
    };
    if (sep.kind != K::String) {  // runs of whitespace, no empty fields
      size_t k = 0, words = 0;
      while (k < s.size()) {
        while (k < s.size() && std::isspace((unsigned char)s[k])) ++k;
        if (k >= s.size()) break;
        size_t e = k;
        while (e < s.size() && !std::isspace((unsigned char)s[e])) ++e;
        if (maxn >= 0 && int64_t(++words) > maxn + 1) fail("split() with maxsplit on whitespace is not supported");
        part(s.substr(k, e - k));
        k = e;
      }
      return new_list(std::move(out));
    }
    if (sep.s.empty()) fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      for (int64_t n = 0; maxn < 0 || n < maxn; ++n) {
        size_t p = find_sub(s, sep.s, start);
        if (p == std::string::npos) break;
        part(s.substr(start, p - start));
        start = p + sep.s.size();
      }
      part(s.substr(start));
      return new_list(std::move(out));
    }
    // rsplit: the same scan over the reversed text and separator (rfind is quadratic too).
    const std::string rs(s.rbegin(), s.rend()), rsep(sep.s.rbegin(), sep.s.rend());
    size_t start = 0;
    auto unreversed = [&](size_t from, size_t to) { return std::string(rs.rend() - to, rs.rend() - from); };
    for (int64_t n = 0; maxn < 0 || n < maxn; ++n) {
      size_t p = find_sub(rs, rsep, start);
      if (p == std::string::npos) break;
      part(unreversed(start, p));
      start = p + rsep.size();
    }
    part(unreversed(start, rs.size()));
    std::reverse(out.begin(), out.end());
    return new_list(std::move(out));
  }

  std::string replace(const std::string& s, const Value& from, const Value& to, const Value& count) {
    if (from.kind != K::String || to.kind != K::String) fail("replace() arguments must be strings");
    int64_t left = count.kind == K::Int ? count.i : -1;
    std::string out;
    size_t p = 0;
    if (from.s.empty()) fail("replace() of an empty string is not supported");
    while (left != 0) {
      size_t q = find_sub(s, from.s, p);
      if (q == std::string::npos) break;
      need_string(out.size() + (q - p) + to.s.size());
      out.append(s, p, q - p);
      out += to.s;
      p = q + from.s.size();
      --left;
    }
    need_string(out.size() + (s.size() - p));
    return out.append(s, p, std::string::npos);
  }

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

  std::string join(const Value& seq, const std::string& sep, const Value& attr = Value::undefined()) {
    std::string out;
    bool first = true;
    for (const Value& v : items_of(seq)) {
      const std::string item = attr.defined() ? get_attr_path(v, attr).str() : v.str();
      need_string(out.size() + (first ? 0 : sep.size()) + item.size());
      out += (first ? "" : sep) + item;
      first = false;
    }
    return out;
  }

  // `attribute="a.b"` of map/selectattr/join/sort: a dotted path of items.
  Value get_attr_path(const Value& v, const Value& attr) {
    if (attr.kind == K::Int) return get_item(v, attr);
    Value cur = v;
    std::string path = attr.str();
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      cur = !part.empty() && std::isdigit((unsigned char)part[0]) ? get_item(cur, Value::integer(parse_int(part)))
                                                                   : (cur.defined() ? get_attr_or_item(cur, part, false) : cur);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  // ---- filters -----------------------------------------------------------------------

  Value filter(const std::string& f, const Value& x, CallArgs& a) {
    if (f == "length" || f == "count") {
      switch (x.kind) {
        case K::Undefined: return Value::integer(0);
        case K::String: return Value::integer(int64_t(cp_count(x.s)));
        case K::List: return Value::integer(int64_t(x.list->size()));
        case K::Dict: return Value::integer(int64_t(x.dict->items.size()));
        default: fail(std::string("object of type '") + x.type_name() + "' has no len()");
      }
    }
    if (f == "default" || f == "d") {
      const bool boolean = a.get(1, "boolean").truthy();
      if (!x.defined() || (boolean && !x.truthy())) {
        Value d = a.get(0, "default_value");
        return d.defined() ? d : Value::string("");
      }
      return x;
    }
    if (f == "safe") return x;
    if (f == "string") return Value::string(x.str());
    if (f == "tojson") {
      Value ind = a.get(0, "indent");
      return Value::string(to_json(x, ind.kind == K::Int ? ind.i : -1, a.get(1, "sort_keys").truthy()));
    }
    if (f == "items") {
      if (!x.defined()) return Value::make_list();
      if (x.kind != K::Dict) fail("filter 'items' needs a mapping, got '" + std::string(x.type_name()) + "'");
      CallArgs none;
      return (*method(x, "items").fn)(none);
    }
    if (f == "list") return Value::make_list(items_of(x));
    if (f == "join") return Value::string(join(x, a.get(0, "d").kind == K::String ? a.get(0, "d").s : "", a.get(1, "attribute")));
    if (f == "first" || f == "last") {
      if (x.kind == K::List && !x.list->empty()) return f == "first" ? x.list->front() : x.list->back();
      if (x.kind == K::String && !x.s.empty()) return get_item(x, Value::integer(f == "first" ? 0 : -1));
      List l = items_of(x);
      if (l.empty()) return Value::undefined(f);
      return f == "first" ? l.front() : l.back();
    }
    if (f == "reverse") {
      if (x.kind == K::String) {
        List l = items_of(x);
        std::string s;
        for (auto it = l.rbegin(); it != l.rend(); ++it) s += it->s;
        return Value::string(s);
      }
      List l = items_of(x);
      std::reverse(l.begin(), l.end());
      return Value::make_list(std::move(l));
    }
    need_defined(x);
    if (f == "trim") {
      if (x.kind != K::String) return Value::string(strip_chars(x.str(), a.get(0, "chars"), true, true));
      return Value::string(strip_chars(x.s, a.get(0, "chars"), true, true));
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      CallArgs none;
      return (*method(Value::string(x.str()), f).fn)(none);
    }
    if (f == "replace") return Value::string(replace(x.str(), a.get(0, "old"), a.get(1, "new"), a.get(2, "count")));
    if (f == "int") {
      if (x.kind == K::String) {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(x.s.c_str(), &end, 10);
        if (end == x.s.c_str() || size_t(end - x.s.c_str()) != x.s.size()) return Value::integer(0);
        if (errno == ERANGE) overflow();
        return Value::integer(v);
      }
      if (x.kind == K::Float) {
        if (std::isnan(x.f)) return Value::integer(0);  // jinja2's int filter: the default
        // Only doubles in [-2^63, 2^63) convert without undefined behaviour.
        if (!(x.f >= -9223372036854775808.0 && x.f < 9223372036854775808.0)) overflow();
        return Value::integer(int64_t(x.f));
      }
      return is_number(x) ? Value::integer(as_int(x)) : Value::integer(0);
    }
    if (f == "float") return is_number(x) ? Value::number(as_double(x)) : Value::number(0);
    if (f == "abs") {
      if (!is_number(x)) fail("bad operand type for abs()");
      if (x.kind == K::Float) return Value::number(std::fabs(x.f));
      return Value::integer(as_int(x) < 0 ? sub(0, as_int(x)) : as_int(x));
    }
    if (f == "indent") return Value::string(indent(x.str(), a));
    if (f == "map") return map(x, a);
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") return select(f, x, a);
    if (f == "unique") {
      List out;
      for (const Value& v : items_of(x))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); })) out.push_back(v);
      return new_list(std::move(out));
    }
    if (f == "dictsort") {
      if (x.kind != K::Dict) fail("filter 'dictsort' needs a mapping");
      Dict d = *x.dict;
      std::stable_sort(d.items.begin(), d.items.end(), [](const auto& p, const auto& q) { return p.first < q.first; });
      CallArgs none;
      return (*method(Value::make_dict(std::move(d)), "items").fn)(none);
    }
    fail("unsupported filter '" + f + "'");
  }

  std::string indent(const std::string& s, const CallArgs& a) {
    Value w = a.get(0, "width");
    const int64_t width = w.kind == K::Int ? w.i : 4;
    if (w.kind != K::String && width > 0) need_string(size_t(width));
    const std::string pad = w.kind == K::String ? w.s : std::string(size_t(std::max<int64_t>(width, 0)), ' ');
    const bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
    std::string out;
    size_t start = 0;
    bool first_line = true;
    while (start <= s.size()) {
      size_t nl = s.find('\n', start);
      std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool padded = (first_line ? first : true) && (blank || !line.empty());
      need_string(out.size() + (padded ? pad.size() : 0) + line.size() + 1);
      if (padded) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return out;
  }

  Value map(const Value& x, CallArgs& a) {
    List out;
    Value attr = a.get(99, "attribute");
    for (const Value& v : items_of(x)) {
      if (attr.defined()) {
        Value r = get_attr_path(v, attr);
        Value dflt = a.get(99, "default");
        out.push_back(!r.defined() && dflt.defined() ? dflt : r);
      } else {
        Value name = a.get(0, "");
        if (name.kind != K::String) fail("map needs a filter name or attribute=");
        CallArgs rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(filter(name.s, v, rest));
      }
    }
    return new_list(std::move(out));
  }

  Value select(const std::string& f, const Value& x, CallArgs& a) {
    const bool attr = f == "selectattr" || f == "rejectattr";
    const bool keep_if = f == "select" || f == "selectattr";
    List out;
    for (const Value& v : items_of(x)) {
      Value subject = attr ? get_attr_path(v, a.get(0, "")) : v;
      const size_t tpos = attr ? 1 : 0;
      bool r;
      if (a.pos.size() <= tpos) {
        r = subject.truthy();
      } else {
        CallArgs targs;
        targs.pos.assign(a.pos.begin() + long(tpos) + 1, a.pos.end());
        r = test(a.pos[tpos].str(), subject, targs);
      }
      if (r == keep_if) out.push_back(v);
    }
    return Value::make_list(std::move(out));
  }

  // ---- tests -------------------------------------------------------------------------

  bool test(const std::string& t, const Value& x, CallArgs& a) {
    if (t == "defined") return x.defined();
    if (t == "undefined") return !x.defined();
    if (t == "none") return x.kind == K::None;
    if (t == "boolean") return x.kind == K::Bool;
    if (t == "true") return x.kind == K::Bool && x.b;
    if (t == "false") return x.kind == K::Bool && !x.b;
    if (t == "integer") return x.kind == K::Int;
    if (t == "float") return x.kind == K::Float;
    if (t == "number") return is_number(x);
    if (t == "string") return x.kind == K::String;
    if (t == "mapping") return x.kind == K::Dict && !x.is_namespace;
    if (t == "iterable") return x.kind == K::List || x.kind == K::String || (x.kind == K::Dict && !x.is_namespace) || x.kind == K::Undefined;
    if (t == "sequence") return x.kind == K::List || x.kind == K::String || (x.kind == K::Dict && !x.is_namespace) || x.kind == K::Undefined;
    if (t == "callable") return x.kind == K::Func;
    if (t == "sameas") {
      Value o = a.get(0, "other");
      if (x.kind != o.kind) return false;
      if (x.kind == K::List) return x.list == o.list;
      if (x.kind == K::Dict) return x.dict == o.dict;
      return equal(x, o);
    }
    if (t == "equalto" || t == "eq" || t == "==") return equal(x, a.get(0, "other"));
    if (t == "ne" || t == "!=") return !equal(x, a.get(0, "other"));
    if (t == "in") return contains(a.get(0, "seq"), x);
    if (t == "lower" || t == "upper") {
      std::string s = x.str();
      return std::none_of(s.begin(), s.end(), [&](char c) {
        return t == "lower" ? std::isupper((unsigned char)c) : std::islower((unsigned char)c);
      }) && std::any_of(s.begin(), s.end(), [](char c) { return std::isalpha((unsigned char)c); });
    }
    if (t == "even" || t == "odd" || t == "divisibleby") {
      need_defined(x);
      if (!is_number(x)) fail("test '" + t + "' needs a number");
      int64_t n = as_int(x);
      if (t == "even") return n % 2 == 0;
      if (t == "odd") return n % 2 != 0;
      Value d = a.get(0, "num");
      if (!is_number(d) || as_int(d) == 0) fail("divisibleby needs a non-zero number");
      return as_int(d) == -1 || n % as_int(d) == 0;  // INT64_MIN % -1 overflows
    }
    if (t == "lt" || t == "gt" || t == "le" || t == "ge" || t == "<" || t == ">" || t == "<=" || t == ">=") {
      Value o = a.get(0, "other");
      if (!is_number(x) || !is_number(o)) fail("test '" + t + "' needs numbers");
      double p = as_double(x), q = as_double(o);
      if (t == "lt" || t == "<") return p < q;
      if (t == "gt" || t == ">") return p > q;
      if (t == "le" || t == "<=") return p <= q;
      return p >= q;
    }
    fail("unsupported test '" + t + "'");
  }
};

}  // namespace

Template::Template(const std::string& source, const std::string& name)
    : name_(name), root_(parse_template(source, name)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Dict& globals) const {
  std::string out;
  Renderer r(name_, globals);
  r.run(*root_, out);
  return out;
}

}  // namespace arbiter::jinja
