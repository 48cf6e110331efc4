// Values of the Jinja subset (tokenizer/jinja.h): Python's str(), repr(), float repr and
// json.dumps, so that what a template prints matches what Python jinja2 prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja.h"

namespace arbiter::jinja {

const Value* Dict::find(const std::string& k) const {
  for (const auto& [key, v] : items)
    if (key == k) return &v;
  return nullptr;
}

void Dict::set(const std::string& k, Value v) {
  for (auto& [key, old] : items)
    if (key == k) {
      old = std::move(v);
      return;
    }
  items.emplace_back(k, std::move(v));
}

// A container's depth and refs from its elements, refused past kMaxValueDepth before the
// value exists (a deeper one could not be destroyed without deep recursion).
static void set_nesting(Value& v, const Value& elem) {
  v.depth = std::max(v.depth, elem.depth + 1);
  v.refs = v.refs || elem.refs;
  if (v.depth > kMaxValueDepth)
    throw ValueError("values nested deeper than " + std::to_string(kMaxValueDepth) + " lists/dicts");
}

Value Value::make_list(List x) {
  Value v;
  v.kind = Kind::List;
  v.depth = 1;
  for (const Value& e : x) set_nesting(v, e);
  v.list = std::make_shared<List>(std::move(x));
  return v;
}

Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::Dict;
  v.depth = 1;
  for (const auto& [k, e] : x.items) set_nesting(v, e);
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}

Value Value::function(Func f) {
  Value v;
  v.kind = Kind::Func;
  v.refs = true;
  v.fn = std::make_shared<Func>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e));
      return make_dict(std::move(d));
    }
    default: return undefined();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return is_namespace || !dict->items.empty();
    case Kind::Func: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Dict: return is_namespace ? "Namespace" : "dict";
    case Kind::Func: return "function";
  }
  return "?";
}

// Shortest digits that read back as x (what Python's repr does), laid out by Python's rule:
// positional for decimal exponents in [-4, 16), else d.ddde+XX.
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string e(buf);
  const bool neg = e[0] == '-';
  if (neg) e.erase(0, 1);
  const size_t epos = e.find('e');
  const int exp = std::atoi(e.c_str() + epos + 1);
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (e[k] != '.') digits += e[k];
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else {
      if (digits.size() < size_t(exp) + 1) digits += std::string(size_t(exp) + 1 - digits.size(), '0');
      out = digits.substr(0, size_t(exp) + 1);
      std::string frac = digits.substr(size_t(exp) + 1);
      out += '.';
      out += frac.empty() ? std::string("0") : frac;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

// Refuses, before out grows, n more bytes that would take it past max.
static void room(const std::string& out, size_t n, size_t max) {
  if (n > max - std::min(max, out.size()))
    throw ValueError("text of more than " + std::to_string(max) + " bytes");
}

static void put(std::string& out, const std::string& text, size_t max) {
  room(out, text.size(), max);
  out += text;
}

// Python's repr of a str, appended to out (sized first: escapes grow it up to 4x).
static void repr_string(const std::string& s, std::string& out, size_t max) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  auto escaped = [q](unsigned char c) -> size_t {
    if (c == '\\' || c == q || c == '\n' || c == '\r' || c == '\t') return 2;
    return c < 0x20 || c == 0x7f ? 4 : 1;
  };
  size_t n = 2;
  for (unsigned char c : s) n += escaped(c);
  room(out, n, max);
  out += q;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  out += q;
}

static void repr_into(const Value& v, std::string& out, size_t max) {
  switch (v.kind) {
    case Value::Kind::String: repr_string(v.s, out, max); return;
    case Value::Kind::List:
      put(out, "[", max);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) put(out, ", ", max);
        repr_into((*v.list)[k], out, max);
      }
      put(out, "]", max);
      return;
    case Value::Kind::Dict:
      put(out, v.is_namespace ? "<Namespace {" : "{", max);
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) put(out, ", ", max);
        repr_string(v.dict->items[k].first, out, max);
        put(out, ": ", max);
        repr_into(v.dict->items[k].second, out, max);
      }
      put(out, v.is_namespace ? "}>" : "}", max);
      return;
    default: put(out, v.str(max), max);
  }
}

std::string Value::repr(size_t max_bytes) const {
  std::string out;
  repr_into(*this, out, max_bytes);
  return out;
}

std::string Value::str(size_t max_bytes) const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return python_float(f);
    case Kind::String: {
      std::string out;
      put(out, s, max_bytes);
      return out;
    }
    case Kind::Func: return "<function>";
    default: return repr(max_bytes);
  }
}

// A JSON string, appended to out (sized first: escapes grow it up to 6x).
static void json_string(const std::string& s, std::string& out, size_t max) {
  size_t n = 2;
  for (unsigned char c : s)
    n += c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f' ? 2
         : c < 0x20                                                                            ? 6
                                                                                               : 1;
  room(out, n, max);
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_value(const Value& v, int64_t indent, bool sort_keys, int depth, std::string& out, size_t max) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    // indent * d without overflow: d <= 2 * kMaxValueDepth + 2
    const size_t n = uint64_t(indent) > max ? max + 1 : size_t(indent) * size_t(d);
    room(out, n + 1, max);
    out += '\n';
    out.append(n, ' ');
  };
  const std::string item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::None: put(out, "null", max); return;
    case Value::Kind::Bool: put(out, v.b ? "true" : "false", max); return;
    case Value::Kind::Int: put(out, std::to_string(v.i), max); return;
    case Value::Kind::Float:
      put(out, std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : python_float(v.f), max);
      return;
    case Value::Kind::String: json_string(v.s, out, max); return;
    case Value::Kind::List: {
      if (v.list->empty()) {
        put(out, "[]", max);
        return;
      }
      put(out, "[", max);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) put(out, item_sep, max);
        newline(depth + 1);
        json_value((*v.list)[k], indent, sort_keys, depth + 1, out, max);
      }
      newline(depth);
      put(out, "]", max);
      return;
    }
    case Value::Kind::Dict: {
      if (v.is_namespace) throw ValueError("tojson: a namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        put(out, "{}", max);
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& it : v.dict->items) items.push_back(&it);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      put(out, "{", max);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) put(out, item_sep, max);
        newline(depth + 1);
        json_string(items[k]->first, out, max);
        put(out, ": ", max);
        json_value(items[k]->second, indent, sort_keys, depth + 1, out, max);
      }
      newline(depth);
      put(out, "}", max);
      return;
    }
    default:
      throw ValueError(std::string("tojson: a value of type ") + v.type_name() + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, int64_t indent, bool sort_keys, size_t max_bytes) {
  std::string out;
  json_value(v, indent, sort_keys, 0, out, max_bytes);
  return out;
}

Value CallArgs::get(size_t n, const std::string& name) const {
  if (n < pos.size()) return pos[n];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return Value::undefined(name);
}

}  // namespace arbiter::jinja
