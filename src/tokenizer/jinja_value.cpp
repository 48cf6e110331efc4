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

Value Value::make_list(List x) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(x));
  return v;
}

Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}

Value Value::function(Func f) {
  Value v;
  v.kind = Kind::Func;
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

static std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
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
  return out + q;
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::String: return repr_string(s);
    case Kind::List: {
      std::string out = "[";
      for (size_t k = 0; k < list->size(); ++k) out += (k ? ", " : "") + (*list)[k].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = is_namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < dict->items.size(); ++k)
        out += (k ? ", " : "") + repr_string(dict->items[k].first) + ": " + dict->items[k].second.repr();
      return out + (is_namespace ? "}>" : "}");
    }
    default: return str();
  }
}

std::string Value::str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return python_float(f);
    case Kind::String: return s;
    case Kind::Func: return "<function>";
    default: return repr();
  }
}

static void json_string(const std::string& s, std::string& out) {
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

static void json_value(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  const std::string item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                                                       : python_float(v.f);
      return;
    case Value::Kind::String: json_string(v.s, out); return;
    case Value::Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_value((*v.list)[k], indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Value::Kind::Dict: {
      if (v.is_namespace) throw Error("[jinja] tojson: a namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& it : v.dict->items) items.push_back(&it);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_string(items[k]->first, out);
        out += ": ";
        json_value(items[k]->second, indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      throw Error(std::string("[jinja] tojson: a value of type ") + v.type_name() +
                  " is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_value(v, indent, sort_keys, 0, out);
  return out;
}

Value CallArgs::get(size_t n, const std::string& name) const {
  if (n < pos.size()) return pos[n];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return Value::undefined(name);
}

}  // namespace arbiter::jinja
