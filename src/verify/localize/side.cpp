#include "verify/localize/side.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace arbiter::verify {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool starts_with_device(const std::string& frag) {
  for (const char* d : {"ref", "cpu", "cuda"}) {
    size_t n = std::char_traits<char>::length(d);
    if (frag.compare(0, n, d) == 0 && (frag.size() == n || frag[n] == ':' || frag[n] == '+'))
      return true;
  }
  return false;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

Side parse_side(const std::string& text_in) {
  Side s;
  s.label = trim(text_in);
  const std::string& t = s.label;
  ARB_CHECK(!t.empty(), "[side] empty side (expected e.g. ref, cpu, cuda:bf16)");
  // Suffixes: the device part ends at the first '+'; each suffix is +inject=... or +mix=...
  // and runs up to the next "+inject=" / "+mix=" marker (specs never contain those).
  size_t plus = t.find('+');
  std::string dev = t.substr(0, plus);
  std::string inject_text, mix_text;
  size_t at = plus;
  while (at != std::string::npos) {
    std::string rest = t.substr(at + 1);
    std::string key;
    if (rest.rfind("inject=", 0) == 0)
      key = "inject";
    else if (rest.rfind("mix=", 0) == 0)
      key = "mix";
    else
      throw Error("[side] '" + t + "': unknown suffix '+" + rest +
                  "' (expected +inject=SPEC or +mix=SPEC)");
    size_t next = std::string::npos;
    for (const char* m : {"+inject=", "+mix="}) next = std::min(next, t.find(m, at + 1));
    std::string val =
        t.substr(at + 1 + key.size() + 1,
                 next == std::string::npos ? std::string::npos : next - (at + 1 + key.size() + 1));
    std::string& dst = key == "inject" ? inject_text : mix_text;
    ARB_CHECK(dst.empty(), "[side] '%s': +%s given twice", t.c_str(), key.c_str());
    ARB_CHECK(!val.empty(), "[side] '%s': +%s= has no value", t.c_str(), key.c_str());
    dst = val;
    at = next;
  }

  std::vector<std::string> parts;
  std::stringstream ss(dev);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (!dev.empty() && dev.back() == ':') parts.push_back("");
  ARB_CHECK(!parts.empty() && (parts[0] == "ref" || parts[0] == "cpu" || parts[0] == "cuda"),
            "[side] '%s': unknown device '%s' (expected ref, cpu, cuda, cuda:N, with an "
            "optional :DTYPE)",
            t.c_str(), parts.empty() ? "" : parts[0].c_str());
  const std::string& name = parts[0];
  std::string index, dtype;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (all_digits(p) && index.empty() && dtype.empty()) {
      ARB_CHECK(name == "cuda", "[side] '%s': a device index applies to cuda only", t.c_str());
      index = p;
    } else if ((p == "f64" || p == "f32" || p == "bf16" || p == "f16") && dtype.empty()) {
      dtype = p;
    } else {
      throw Error("[side] '" + t + "': unexpected '" + p +
                  "' (expected DEVICE[:INDEX][:DTYPE], dtype f64, f32, bf16 or f16)");
    }
  }
  // The tiers' own checks say which dtypes they compute in; say it here too so the message
  // names the side.
  ARB_CHECK(name != "ref" || dtype.empty() || dtype == "f64", "[side] '%s': ref computes in f64",
            t.c_str());
  ARB_CHECK(name != "cpu" || dtype.empty() || dtype == "f32", "[side] '%s': cpu computes in f32",
            t.c_str());
  ARB_CHECK(name != "cuda" || dtype != "f64", "[side] '%s': cuda computes in bf16, f16 or f32",
            t.c_str());
  s.spec.device = index.empty() ? name : name + ":" + index;
  s.spec.dtype = dtype;
  if (!mix_text.empty()) {
    ARB_CHECK(name == "cuda", "[side] '%s': +mix applies to cuda sides only", t.c_str());
    s.spec.mix = canonical_mix(mix_text);
  }
  if (!inject_text.empty()) s.inject = InjectSpec::parse(inject_text);
  return s;
}

std::vector<Side> parse_sides(const std::string& list) {
  std::vector<std::string> sides;
  std::stringstream ss(list);
  for (std::string frag; std::getline(ss, frag, ',');) {
    std::string f = trim(frag);
    // A continuation is a key=value fragment of the previous side's +inject/+mix spec;
    // anything else is a side of its own (and parse_side names it if it is not one).
    bool continues = !sides.empty() && !starts_with_device(f) && f.find('=') != std::string::npos &&
                     sides.back().find('+') != std::string::npos;
    if (continues)
      sides.back() += "," + f;
    else
      sides.push_back(f);
  }
  ARB_CHECK(!sides.empty(), "[side] empty list of sides (expected e.g. ref,cpu,cuda:bf16)");
  std::vector<Side> out;
  for (const std::string& s : sides) out.push_back(parse_side(s));
  return out;
}

std::unique_ptr<Backend> make_side_backend(const Side& s, int threads) {
  DeviceSpec spec = s.spec;
  spec.threads = threads;
  return make_tier(spec);
}

}  // namespace arbiter::verify
