// Evaluator of the Jinja subset (tokenizer/jinja.h): scopes as jinja2 has them (a for loop
// body and a macro get their own frame per run; if does not), Python semantics for
// operators, and the filters, tests and str/dict methods that chat templates use. Where
// Python would raise (an undefined value in arithmetic, 'a' + None), this raises too, so a
// template never renders text that transformers would refuse.
#include <algorithm>
#include <cmath>
#include <ctime>
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

bool equal(const Value& x, const Value& y) {
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
        const Value* o = y.dict->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case K::Func: return x.fn == y.fn;
    default: return false;
  }
}

// The elements a value iterates over (a dict: its keys; a string: its characters).
List iterate(const Value& v, const std::function<void(const std::string&)>& fail) {
  switch (v.kind) {
    case K::Undefined: return {};
    case K::List: return *v.list;
    case K::Dict: {
      List out;
      if (v.is_namespace) fail("a namespace is not iterable");
      for (const auto& [k, x] : v.dict->items) out.push_back(Value::string(k));
      return out;
    }
    case K::String: {
      List out;
      for (size_t k = 0; k < v.s.size();) {  // one UTF-8 code point each
        size_t n = 1;
        unsigned char c = (unsigned char)v.s[k];
        if (c >= 0xF0) n = 4;
        else if (c >= 0xE0) n = 3;
        else if (c >= 0xC0) n = 2;
        out.push_back(Value::string(v.s.substr(k, n)));
        k += n;
      }
      return out;
    }
    default: fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
  return {};
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
    frames_.emplace_back();  // the template's own top-level variables
  }

  void run(const Node& root, std::string& out) { exec(root, out); }

 private:
  const std::string& name_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  int line_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(strformat("[jinja] %s:%d: %s", name_.c_str(), line_, what.c_str()));
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
    line_ = n.line;
    switch (n.kind) {
      case Node::Kind::Block:
        for (const auto& c : n.a) {
          Flow f = exec(*c, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case Node::Kind::Text: out += n.name; return Flow::Normal;
      case Node::Kind::Output: out += eval(*n.a[0]).str(); return Flow::Normal;
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
          ns.dict->set(n.name, std::move(v));
        } else if (n.names.size() == 1) {
          frames_.back()[n.names[0]] = std::move(v);
        } else {
          List items = iterate(v, [&](const std::string& w) { fail(w); });
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
    if (args.pos.size() > m.names.size()) fail("macro '" + m.name + "' takes " + std::to_string(m.names.size()) + " arguments");
    std::unordered_map<std::string, Value> frame;
    for (size_t k = 0; k < m.names.size(); ++k) {
      Value v = args.get(k, m.names[k]);
      if (!v.defined() && m.a[k]) v = eval(*m.a[k]);
      frame[m.names[k]] = v;
    }
    // The macro sees the globals and the template's top-level names, not the caller's.
    std::vector<std::unordered_map<std::string, Value>> saved(frames_.begin() + 2, frames_.end());
    frames_.resize(2);
    frames_.push_back(std::move(frame));
    std::string body;
    const int line = line_;
    try {
      exec(*m.b[0], body);
    } catch (...) {
      frames_.resize(2);
      frames_.insert(frames_.end(), saved.begin(), saved.end());
      throw;
    }
    frames_.resize(2);
    frames_.insert(frames_.end(), saved.begin(), saved.end());
    line_ = line;
    return Value::string(body);
  }

  Flow exec_for(const Node& n, std::string& out) {
    List items = iterate(eval(*n.a[0]), [&](const std::string& w) { fail(w); });
    auto bind = [&](std::unordered_map<std::string, Value>& f, const Value& item) {
      if (n.names.size() == 1) {
        f[n.names[0]] = item;
        return;
      }
      List parts = iterate(item, [&](const std::string& w) { fail(w); });
      if (parts.size() != n.names.size())
        fail(strformat("cannot unpack %zu values into %zu loop variables", parts.size(), n.names.size()));
      for (size_t k = 0; k < parts.size(); ++k) f[n.names[k]] = parts[k];
    };
    if (n.a[1]) {  // `for x in xs if cond`: loop.* counts the kept items only
      List kept;
      for (const Value& it : items) {
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
      Dict loop;
      loop.set("index0", Value::integer(k));
      loop.set("index", Value::integer(k + 1));
      loop.set("revindex0", Value::integer(len - k - 1));
      loop.set("revindex", Value::integer(len - k));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == len - 1));
      loop.set("length", Value::integer(len));
      loop.set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem"));
      loop.set("nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("nextitem"));
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
        return x.kind == K::Float ? Value::number(-x.f) : Value::integer(-as_int(x));
      }
      case Node::Kind::Binary: return binary(n);
      case Node::Kind::Cond:
        if (eval(*n.a[0]).truthy()) return eval(*n.a[1]);
        return n.a[2] ? eval(*n.a[2]) : Value::undefined();
      case Node::Kind::ListLit: {
        List l;
        for (const auto& e : n.a) l.push_back(eval(*e));
        return Value::make_list(std::move(l));
      }
      case Node::Kind::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < n.a.size(); k += 2) {
          Value key = eval(*n.a[k]);
          if (key.kind != K::String) fail("dict keys must be strings in this Jinja subset");
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
    if (op == "~") return Value::string(l.str() + r.str());
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
      if (l.kind == K::String && r.kind == K::String) return Value::string(l.s + r.s);
      if (l.kind == K::List && r.kind == K::List) {
        List x = *l.list;
        x.insert(x.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(x));
      }
    }
    if (op == "*" && ((l.kind == K::String && r.kind == K::Int) || (l.kind == K::Int && r.kind == K::String))) {
      const Value& s = l.kind == K::String ? l : r;
      std::string out;
      for (int64_t k = 0; k < (l.kind == K::Int ? l.i : r.i); ++k) out += s.s;
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
      if (!fl && as_int(r) >= 0) {
        int64_t x = 1;
        for (int64_t k = 0; k < as_int(r); ++k) x *= as_int(l);
        return Value::integer(x);
      }
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
      if (op == "+") return Value::integer(x + y);
      if (op == "-") return Value::integer(x - y);
      if (op == "*") return Value::integer(x * y);
      if (y == 0) fail("division by zero");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
      if (op == "//") return Value::integer(q);
      if (op == "%") return Value::integer(x - q * y);
    }
    type_error();
    return {};
  }

  bool contains(const Value& hay, const Value& needle) {
    switch (hay.kind) {
      case K::String:
        if (needle.kind != K::String) fail("'in <string>' requires a string as left operand");
        return hay.s.find(needle.s) != std::string::npos;
      case K::List:
        for (const Value& v : *hay.list)
          if (equal(v, needle)) return true;
        return false;
      case K::Dict: return needle.kind == K::String && hay.dict->find(needle.s);
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
      List chars = iterate(obj, [&](const std::string& w) { fail(w); });
      int64_t i = norm_index(as_int(key), int64_t(chars.size()));
      return i >= 0 && i < int64_t(chars.size()) ? chars[size_t(i)] : Value::undefined();
    }
    return Value::undefined();
  }

  Value get_attr(const Value& obj, const std::string& name) {
    need_defined(obj);
    if (!name.empty() && std::isdigit((unsigned char)name[0])) return get_item(obj, Value::integer(std::stoll(name)));
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
    List items;
    if (obj.kind == K::List) items = *obj.list;
    else if (obj.kind == K::String) items = iterate(obj, [&](const std::string& w) { fail(w); });
    else fail(std::string("'") + obj.type_name() + "' object is not subscriptable");
    const int64_t len = int64_t(items.size());
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
    // Python's slice.indices()
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    start = clamp(start, hs, step > 0 ? 0 : len - 1);
    stop = clamp(stop, he, step > 0 ? len : -1);
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(items[size_t(k)]);
    if (obj.kind == K::String) {
      std::string s;
      for (const Value& c : out) s += c.s;
      return Value::string(s);
    }
    return Value::make_list(std::move(out));
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
          size_t p = x.kind == K::String ? s.find(x.s) : std::string::npos;
          return Value::integer(p == std::string::npos ? -1 : int64_t(p));
        });
      if (name == "join")
        return bound([this, s](CallArgs& a) { return Value::string(join(a.get(0, "iterable"), s)); });
      return Value::undefined(name);
    }
    if (obj.kind == K::Dict && !obj.is_namespace) {
      auto d = obj.dict;
      if (name == "items")
        return bound([d](CallArgs&) {
          List out;
          for (const auto& [k, v] : d->items) out.push_back(Value::make_list({Value::string(k), v}));
          return Value::make_list(std::move(out));
        });
      if (name == "keys" || name == "values")
        return bound([d, name](CallArgs&) {
          List out;
          for (const auto& [k, v] : d->items) out.push_back(name == "keys" ? Value::string(k) : v);
          return Value::make_list(std::move(out));
        });
      if (name == "get")
        return bound([d](CallArgs& a) {
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
    if (sep.kind != K::String) {  // runs of whitespace, no empty fields
      std::vector<std::string> words;
      size_t k = 0;
      while (k < s.size()) {
        while (k < s.size() && std::isspace((unsigned char)s[k])) ++k;
        if (k >= s.size()) break;
        size_t e = k;
        while (e < s.size() && !std::isspace((unsigned char)s[e])) ++e;
        words.push_back(s.substr(k, e - k));
        k = e;
      }
      if (maxn >= 0 && int64_t(words.size()) > maxn + 1) fail("split() with maxsplit on whitespace is not supported");
      for (auto& w : words) out.push_back(Value::string(w));
      return Value::make_list(std::move(out));
    }
    if (sep.s.empty()) fail("empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
      size_t start = 0;
      for (int64_t n = 0; maxn < 0 || n < maxn; ++n) {
        size_t p = s.find(sep.s, start);
        if (p == std::string::npos) break;
        parts.push_back(s.substr(start, p - start));
        start = p + sep.s.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      for (int64_t n = 0; maxn < 0 || n < maxn; ++n) {
        if (end < sep.s.size()) break;
        size_t p = s.rfind(sep.s, end - sep.s.size());
        if (p == std::string::npos) break;
        parts.insert(parts.begin(), s.substr(p + sep.s.size(), end - p - sep.s.size()));
        end = p;
      }
      parts.insert(parts.begin(), s.substr(0, end));
    }
    for (auto& p : parts) out.push_back(Value::string(p));
    return Value::make_list(std::move(out));
  }

  std::string replace(const std::string& s, const Value& from, const Value& to, const Value& count) {
    if (from.kind != K::String || to.kind != K::String) fail("replace() arguments must be strings");
    int64_t left = count.kind == K::Int ? count.i : -1;
    std::string out;
    size_t p = 0;
    if (from.s.empty()) fail("replace() of an empty string is not supported");
    while (left != 0) {
      size_t q = s.find(from.s, p);
      if (q == std::string::npos) break;
      out += s.substr(p, q - p) + to.s;
      p = q + from.s.size();
      --left;
    }
    return out + s.substr(p);
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
    for (const Value& v : iterate(seq, [&](const std::string& w) { fail(w); })) {
      out += (first ? "" : sep) + (attr.defined() ? get_attr_path(v, attr).str() : v.str());
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
      cur = !part.empty() && std::isdigit((unsigned char)part[0]) ? get_item(cur, Value::integer(std::stoll(part)))
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
        case K::String: return Value::integer(int64_t(iterate(x, [](const std::string&) {}).size()));
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
      return Value::string(to_json(x, ind.kind == K::Int ? int(ind.i) : -1, a.get(1, "sort_keys").truthy()));
    }
    if (f == "items") {
      if (!x.defined()) return Value::make_list();
      if (x.kind != K::Dict) fail("filter 'items' needs a mapping, got '" + std::string(x.type_name()) + "'");
      CallArgs none;
      return (*method(x, "items").fn)(none);
    }
    if (f == "list") return Value::make_list(iterate(x, [&](const std::string& w) { fail(w); }));
    if (f == "join") return Value::string(join(x, a.get(0, "d").kind == K::String ? a.get(0, "d").s : "", a.get(1, "attribute")));
    if (f == "first" || f == "last") {
      List l = iterate(x, [&](const std::string& w) { fail(w); });
      if (l.empty()) return Value::undefined(f);
      return f == "first" ? l.front() : l.back();
    }
    if (f == "reverse") {
      if (x.kind == K::String) {
        List l = iterate(x, [](const std::string&) {});
        std::string s;
        for (auto it = l.rbegin(); it != l.rend(); ++it) s += it->s;
        return Value::string(s);
      }
      List l = iterate(x, [&](const std::string& w) { fail(w); });
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
        try {
          size_t used = 0;
          int64_t v = std::stoll(x.s, &used);
          return Value::integer(used == x.s.size() ? v : 0);
        } catch (...) {
          return Value::integer(0);
        }
      }
      return is_number(x) ? Value::integer(int64_t(as_double(x))) : Value::integer(0);
    }
    if (f == "float") return is_number(x) ? Value::number(as_double(x)) : Value::number(0);
    if (f == "abs") {
      if (!is_number(x)) fail("bad operand type for abs()");
      return x.kind == K::Float ? Value::number(std::fabs(x.f)) : Value::integer(std::llabs(as_int(x)));
    }
    if (f == "indent") return Value::string(indent(x.str(), a));
    if (f == "map") return map(x, a);
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") return select(f, x, a);
    if (f == "unique") {
      List out;
      for (const Value& v : iterate(x, [&](const std::string& w) { fail(w); }))
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); })) out.push_back(v);
      return Value::make_list(std::move(out));
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
    const std::string pad = w.kind == K::String ? w.s : std::string(size_t(w.kind == K::Int ? w.i : 4), ' ');
    const bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
    std::string out;
    size_t start = 0;
    bool first_line = true;
    while (start <= s.size()) {
      size_t nl = s.find('\n', start);
      std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      if ((first_line ? first : true) && (blank || !line.empty())) out += pad;
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
    for (const Value& v : iterate(x, [&](const std::string& w) { fail(w); })) {
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
    return Value::make_list(std::move(out));
  }

  Value select(const std::string& f, const Value& x, CallArgs& a) {
    const bool attr = f == "selectattr" || f == "rejectattr";
    const bool keep_if = f == "select" || f == "selectattr";
    List out;
    for (const Value& v : iterate(x, [&](const std::string& w) { fail(w); })) {
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
      return n % as_int(d) == 0;
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
  Dict g = globals;
  if (!g.find("raise_exception"))
    g.set("raise_exception", Value::function([](CallArgs& a) -> Value { throw RaiseError(a.get(0, "message").str()); }));
  if (!g.find("namespace"))
    g.set("namespace", Value::function([](CallArgs& a) {
            Value ns = Value::make_dict();
            ns.is_namespace = true;
            for (const Value& p : a.pos)
              if (p.kind == K::Dict)
                for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
            for (const auto& [k, v] : a.kw) ns.dict->set(k, v);
            return ns;
          }));
  if (!g.find("range"))
    g.set("range", Value::function([](CallArgs& a) {
            int64_t start = 0, stop = 0, step = 1;
            if (a.pos.size() == 1) stop = a.pos[0].i;
            else if (a.pos.size() >= 2) start = a.pos[0].i, stop = a.pos[1].i;
            if (a.pos.size() >= 3) step = a.pos[2].i;
            if (step == 0 || std::llabs(stop - start) / std::llabs(step) > 1000000)
              throw Error("[jinja] range(): bad or too large range");
            List l;
            for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) l.push_back(Value::integer(k));
            return Value::make_list(std::move(l));
          }));
  std::string out;
  Renderer r(name_, g);
  r.run(*root_, out);
  return out;
}

}  // namespace arbiter::jinja
