// Evaluator of the Jinja subset (tokenizer/jinja.h): scopes as jinja2 has them (a for loop
// body and a macro get their own frame per run; if does not) and Python semantics for
// operators; the filters, tests and str/dict methods are in jinja_library.cpp. Where
// Python would raise (an undefined value in arithmetic, 'a' + None), this raises too, so a
// template never renders text that transformers would refuse.
//
// Budgets (jinja.h): every string an expression evaluates to is charged its bytes when the
// expression returns (so a copy out of a variable costs what the bytes cost to move), every
// list made is charged sizeof(Value) per item, and ops that make a string or a list compute
// its size and check it against kMaxStringBytes / kMaxListItems before allocating it. Loop
// iterations, macro calls and element comparisons count as steps.
#include "tokenizer/jinja_render.h"

namespace arbiter::jinja {

// The elements a value iterates over (a dict: its keys; a string: its code points), sized
// and charged before they are copied.
List Renderer::items_of(const Value& v) {
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
Value Renderer::range(const CallArgs& a) {
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
bool Renderer::equal(const Value& x, const Value& y) {
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

Flow Renderer::exec(const Node& n, std::string& out) {
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

Value Renderer::call_macro(const Node& m, CallArgs& args) {
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

Flow Renderer::exec_for(const Node& n, std::string& out) {
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

Value Renderer::eval_node(const Node& n) {
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

Value Renderer::binary(const Node& n) {
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

bool Renderer::contains(const Value& hay, const Value& needle) {
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

Value Renderer::get_item(const Value& obj, const Value& key) {
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

// jinja2: obj.name tries the Python attribute (a method) first, then the item; obj['name']
// tries the item first. Dicts here have no attributes but their methods.
Value Renderer::get_attr_or_item(const Value& obj, const std::string& name, bool attr_first) {
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

Value Renderer::slice(const Node& n) {
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
