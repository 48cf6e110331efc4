// The str/dict methods, filters and tests of the Jinja subset (tokenizer/jinja.h), as
// Python and jinja2 define them, within the renderer's budgets (jinja_render.h).
#include "tokenizer/jinja_render.h"

namespace arbiter::jinja {

Value Renderer::method(const Value& obj, const std::string& name) {
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

Value Renderer::split(const std::string& s, const Value& sep, const Value& maxsplit, bool from_right) {
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

std::string Renderer::replace(const std::string& s, const Value& from, const Value& to, const Value& count) {
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

std::string Renderer::join(const Value& seq, const std::string& sep, const Value& attr) {
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
Value Renderer::get_attr_path(const Value& v, const Value& attr) {
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

Value Renderer::filter(const std::string& f, const Value& x, CallArgs& a) {
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

std::string Renderer::indent(const std::string& s, const CallArgs& a) {
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

Value Renderer::map(const Value& x, CallArgs& a) {
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

Value Renderer::select(const std::string& f, const Value& x, CallArgs& a) {
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

bool Renderer::test(const std::string& t, const Value& x, CallArgs& a) {
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

}  // namespace arbiter::jinja
