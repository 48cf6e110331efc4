// Trace format v1 writer/reader, the foreign 6-column reader and the full-logits side file.
// The reader is deliberately strict: a trace is evidence, so anything it cannot account for
// (a malformed line, a missing `# end`, a duplicate position) is an error with file and line,
// never a skipped line.
#include "verify/trace/trace.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "io/file.h"

namespace arbiter::verify {

static_assert(std::endian::native == std::endian::little,
              "the full-logits format is little-endian; a big-endian host needs byte swaps");

// ---------------------------------------------------------------------------------------
// Named shapes (DESIGN.md §3).

const std::vector<TraceShape>& named_shapes() {
  static const std::vector<TraceShape> shapes = {
      {"w1", 1, 128, 0, 0, "a decode step with no context"},
      {"w1ctx512", 1, 128, 512, 512, "a decode step behind 512 tokens of state"},
      {"w8", 8, 80, 512, 0, "a verify-sized forward behind context"},
      {"w256", 256, 2, 0, 0, "a prefill-shaped forward"},
      {"w8ctx1536", 8, 40, 1536, 1536, "past a 1024-token sliding window"},
  };
  return shapes;
}

TraceShape named_shape(const std::string& name) {
  std::string known;
  for (const auto& s : named_shapes()) {
    if (s.name == name) return s;
    if (!known.empty()) known += ", ";
    known += s.name;
  }
  throw Error("[trace] unknown shape '" + name + "' (known: " + known + ")");
}

void TraceHeader::set_shape(const TraceShape& s, int64_t topk_) {
  shape_name = s.name;
  chunk_tokens = s.chunk_tokens;
  max_chunks = s.max_chunks;
  prefill = s.prefill;
  start_token = s.start_token;
  topk = topk_;
}

// ---------------------------------------------------------------------------------------
// Writer.

std::string format_trace_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

namespace {

constexpr const char* kColumns[] = {"chunk", "pos", "abs_pos", "target", "nll",
                                    "target_logit", "lse", "top_ids", "top_logits"};
// The column a `# routes` line adds after the v1 columns.
constexpr const char* kRoutesColumn = "routes";
constexpr const char* kForeignColumns[] = {"chunk", "pos", "target", "nll", "top_ids",
                                           "top_logits"};

// Header values are TAB-separated fields: a TAB or newline inside one would shift every
// later field, so the writer refuses them. Unknown values are written as "unknown".
std::string field(const std::string& key, const std::string& v) {
  if (v.find_first_of("\t\n\r") != std::string::npos)
    throw Error("[trace] header field '" + key + "' holds a TAB or newline: '" + v + "'");
  return v.empty() ? "unknown" : v;
}
std::string field(const std::string& key, int64_t v) {
  return v < 0 ? "unknown" : std::to_string(v);
}

bool is_nonfinite(double v) { return !std::isfinite(v); }

}  // namespace

void TraceWriter::open(const std::string& path, const TraceHeader& h) {
  ARB_CHECK(!file_.is_open(), "[trace] %s: writer already open on %s", path.c_str(),
            file_.path().c_str());
  ARB_CHECK(h.topk >= 1, "[trace] %s: header topk must be >= 1 (got %lld)", path.c_str(),
            (long long)h.topk);
  // Build the whole header first so a bad field throws before any file exists.
  std::string s = "# arbiter-trace\t" + std::to_string(kTraceFormatVersion) + "\n";
  s += "# model\t" + field("model", h.model_path) + "\tsha256\t" +
       field("model sha256", h.model_sha256) + "\tarch\t" + field("arch", h.model_arch) +
       "\tparams\t" + field("params", h.model_params) + "\n";
  s += "# tokenizer\tsha256\t" + field("tokenizer sha256", h.tokenizer_sha256) + "\tbos\t" +
       field("bos", h.tokenizer_bos) + "\n";
  s += "# corpus\t" + field("corpus", h.corpus_path) + "\tsha256\t" +
       field("corpus sha256", h.corpus_sha256) + "\ttokens\t" +
       field("tokens", h.corpus_tokens) + "\n";
  s += "# shape\t" + field("shape", h.shape_name) + "\tchunk_tokens\t" +
       field("", h.chunk_tokens) + "\tmax_chunks\t" + field("", h.max_chunks) + "\ttopk\t" +
       field("", h.topk) + "\tprefill\t" + field("", h.prefill) + "\tstart_token\t" +
       field("", h.start_token) + "\n";
  s += "# device\t" + field("device", h.device) + "\tcompute\t" + field("compute", h.compute) +
       "\tweights\t" + field("weights", h.weights) + "\n";
  s += "# providers\t" + field("providers", h.providers) + "\tfallbacks\t" +
       field("", h.fallbacks) + "\n";
  if (!h.act_quant.empty()) s += "# act_quant\t" + field("act_quant", h.act_quant) + "\n";
  s += "# inject\t" + (h.inject.empty() ? std::string("none") : field("inject", h.inject)) + "\n";
  s += "# build\t" + field("build version", h.build_version) + "\t" +
       field("build commit", h.build_commit) + "\t" + field("compiler", h.build_compiler) +
       "\t" + field("cuda", h.build_cuda) + "\n";
  s += "# env";
  if (h.env.empty()) s += "\tnone";
  for (const auto& e : h.env) {
    s += '\t';
    s += field("env", e);
  }
  s += "\n";
  const TraceRoutesHeader& rt = h.routes;
  if (!rt.layers.empty()) {
    ARB_CHECK(rt.experts >= 1 && rt.top_k >= 1 && rt.top_k <= rt.experts,
              "[trace] %s: routes header with %lld experts and top_k %lld", path.c_str(),
              (long long)rt.experts, (long long)rt.top_k);
    s += "# routes\texperts\t" + std::to_string(rt.experts) + "\ttop_k\t" +
         std::to_string(rt.top_k) + "\tscore\t" + field("routes score", rt.score) + "\tlayers\t";
    for (size_t i = 0; i < rt.layers.size(); ++i) {
      ARB_CHECK(rt.layers[i] >= 0 && (i == 0 || rt.layers[i] > rt.layers[i - 1]),
                "[trace] %s: routes layers must be ascending and >= 0", path.c_str());
      s += (i ? "," : "") + std::to_string(rt.layers[i]);
    }
    s += "\n";
  }
  static const std::unordered_set<std::string> reserved = {
      "arbiter-trace", "model", "tokenizer", "corpus", "shape",  "device", "providers",
      "act_quant", "inject",        "build", "env",       "routes", "columns", "end"};
  for (const auto& [k, v] : h.extra) {
    ARB_CHECK(!k.empty() && k.find_first_of("\t\n\r ") == std::string::npos && !reserved.count(k),
              "[trace] extra header key '%s' is empty, holds whitespace or is reserved", k.c_str());
    ARB_CHECK(v.find_first_of("\n\r") == std::string::npos,
              "[trace] extra header '%s' holds a newline", k.c_str());
    s += "# " + k;
    if (!v.empty()) s += "\t" + v;
    s += "\n";
  }
  s += "# columns";
  for (const char* c : kColumns) s += std::string("\t") + c;
  if (!rt.layers.empty()) s += std::string("\t") + kRoutesColumn;
  s += "\n";

  file_.open(path, "[trace]");
  topk_ = h.topk;
  routes_ = rt;
  rows_ = nonfinite_ = 0;
  file_.write(s);
}

void TraceWriter::write_row(const TraceRow& r) {
  ARB_CHECK(file_.is_open(), "[trace] write_row before open");
  ARB_CHECK(int64_t(r.top_ids.size()) == topk_ && int64_t(r.top_logits.size()) == topk_,
            "[trace] %s: row chunk %d pos %d has %zu ids and %zu logits (expected topk %lld)",
            file_.path().c_str(), r.chunk, r.pos, r.top_ids.size(), r.top_logits.size(),
            (long long)topk_);
  std::string s = std::to_string(r.chunk) + "\t" + std::to_string(r.pos) + "\t" +
                  std::to_string(r.abs_pos) + "\t" + std::to_string(r.target) + "\t" +
                  format_trace_float(r.nll) + "\t" + format_trace_float(r.target_logit) + "\t" +
                  format_trace_float(r.lse) + "\t";
  nonfinite_ += is_nonfinite(r.nll) + is_nonfinite(r.target_logit) + is_nonfinite(r.lse);
  for (size_t i = 0; i < r.top_ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(r.top_ids[i]);
  }
  s += "\t";
  for (size_t i = 0; i < r.top_logits.size(); ++i) {
    if (i) s += ',';
    s += format_trace_float(r.top_logits[i]);
    nonfinite_ += is_nonfinite(r.top_logits[i]);
  }
  ARB_CHECK(r.routes.size() == routes_.layers.size(),
            "[trace] %s: row chunk %d pos %d has %zu routes (the header lists %zu MoE layers)",
            file_.path().c_str(), r.chunk, r.pos, r.routes.size(), routes_.layers.size());
  for (size_t l = 0; l < r.routes.size(); ++l) {
    const TraceRoute& x = r.routes[l];
    ARB_CHECK(int64_t(x.ids.size()) == routes_.top_k,
              "[trace] %s: row chunk %d pos %d routes %zu experts at layer %d (top_k %lld)",
              file_.path().c_str(), r.chunk, r.pos, x.ids.size(), routes_.layers[l],
              (long long)routes_.top_k);
    s += l ? ";" : "\t";
    for (size_t i = 0; i < x.ids.size(); ++i) s += (i ? "," : "") + std::to_string(x.ids[i]);
    s += "/" + format_trace_float(x.margin);
  }
  s += "\n";
  file_.write(s);
  ++rows_;
}

void TraceWriter::finish(double elapsed_s) {
  ARB_CHECK(file_.is_open(), "[trace] finish before open");
  file_.write("# end\trows\t" + std::to_string(rows_) + "\telapsed_s\t" +
              format_trace_float(elapsed_s) + "\n");
  file_.commit();
}

// ---------------------------------------------------------------------------------------
// Reader.

namespace {

struct Parser {
  std::string path;
  size_t line = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("[trace] " + path + ":" + std::to_string(line) + ": " + what);
  }

  static std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> out;
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i)
      if (i == s.size() || s[i] == sep) {
        out.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    return out;
  }

  int64_t integer(std::string_view s, const char* what, int64_t lo, int64_t hi) const {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size())
      fail(std::string(what) + ": '" + std::string(s) + "' is not a whole number");
    if (v < lo || v > hi)
      fail(std::string(what) + ": " + std::to_string(v) + " out of range [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "]");
    return v;
  }

  // Accepts what the writer prints (%.9g, nan, inf, -inf) and what other engines print
  // (any decimal or exponent form, NaN/Infinity spellings, -nan).
  double number(std::string_view s, const char* what) const {
    double v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || p != s.data() + s.size() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range))
      fail(std::string(what) + ": '" + std::string(s) + "' is not a number");
    if (ec == std::errc::result_out_of_range)
      fail(std::string(what) + ": '" + std::string(s) + "' is out of double range");
    return v;
  }

  // "unknown" (written for values the runner did not know) reads back as ""/-1.
  static std::string str(std::string_view s) { return s == "unknown" ? "" : std::string(s); }
  int64_t count(std::string_view s, const char* what) const {
    return s == "unknown" ? -1 : integer(s, what, 0, INT64_MAX);
  }

  void keyword(const std::vector<std::string_view>& v, size_t i, const char* kw,
               const std::string& key) const {
    if (i >= v.size() || v[i] != kw)
      fail("'# " + key + "' line: expected '" + kw + "' as value " + std::to_string(i + 1) +
           (i < v.size() ? " (got '" + std::string(v[i]) + "')" : " (line too short)"));
  }
  void arity(const std::vector<std::string_view>& v, size_t n, const std::string& key) const {
    if (v.size() != n)
      fail("'# " + key + "' line: expected " + std::to_string(n) + " values, got " +
           std::to_string(v.size()));
  }

  void list_ints(std::string_view s, std::vector<int32_t>& out) const {
    out.clear();
    for (auto item : split(s, ','))
      out.push_back(int32_t(integer(item, "top_ids entry", 0, INT32_MAX)));
  }
  void list_numbers(std::string_view s, std::vector<double>& out) const {
    out.clear();
    for (auto item : split(s, ',')) out.push_back(number(item, "top_logits entry"));
  }

  // Shared checks of the top-k lists: equal lengths, the header's K, descending logits with
  // ties broken by lower id, no repeated id.
  void check_topk(const TraceRow& r, int64_t& k) const {
    if (r.top_ids.size() != r.top_logits.size())
      fail("top_ids has " + std::to_string(r.top_ids.size()) + " entries but top_logits has " +
           std::to_string(r.top_logits.size()));
    if (k < 0) k = int64_t(r.top_ids.size());
    if (int64_t(r.top_ids.size()) != k)
      fail("row has " + std::to_string(r.top_ids.size()) + " top-k entries (expected " +
           std::to_string(k) + ")");
    for (size_t i = 0; i + 1 < r.top_logits.size(); ++i) {
      double a = r.top_logits[i], b = r.top_logits[i + 1];
      if (std::isnan(a) || std::isnan(b)) continue;  // counted as non-finite, not reordered
      if (a < b || (a == b && r.top_ids[i] > r.top_ids[i + 1]))
        fail("top_logits not in descending order (ties by lower id) at entry " +
             std::to_string(i + 2));
    }
    std::vector<int32_t> ids = r.top_ids;
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) fail("top_ids repeats an id");
  }
};

void count_nonfinite(Trace& t, const TraceRow& r, bool full) {
  int64_t n = is_nonfinite(r.nll);
  if (full) n += is_nonfinite(r.target_logit) + is_nonfinite(r.lse);
  for (double v : r.top_logits) n += is_nonfinite(v);
  t.nonfinite_values += n;
  t.nonfinite_rows += n > 0;
}

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlongs,
// no surrogates, nothing above U+10FFFF), or npos. Traces are UTF-8 text; anything else would
// reach reports and JSON output as garbage.
size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0 || c < 0xC2 || c > 0xF4 || i + size_t(n) >= s.size()) return i;
    uint32_t cp = c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
      unsigned char d = (unsigned char)s[i + size_t(k)];
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += size_t(n) + 1;
  }
  return std::string_view::npos;
}

int64_t pos_key(int64_t chunk, int64_t pos) { return (chunk << 32) | pos; }

// The tail every row format shares: top-k columns, their checks, one row per (chunk, pos),
// NaN/Inf counts (full: the row also has target_logit and lse).
void add_row(Parser& P, Trace& t, TraceRow r, std::string_view ids, std::string_view logits,
             bool full, int64_t& k, std::unordered_set<int64_t>& positions) {
  P.list_ints(ids, r.top_ids);
  P.list_numbers(logits, r.top_logits);
  P.check_topk(r, k);
  if (!positions.insert(pos_key(r.chunk, r.pos)).second)
    P.fail("duplicate row for chunk " + std::to_string(r.chunk) + " pos " +
           std::to_string(r.pos));
  count_nonfinite(t, r, full);
  t.rows.push_back(std::move(r));
}

// A row's routes column: per layer of the `# routes` line, "id,id,.../margin", joined by ';'.
void read_routes(const Parser& P, std::string_view s, const TraceRoutesHeader& h,
                 std::vector<TraceRoute>& out) {
  const auto entries = Parser::split(s, ';');
  if (entries.size() != h.layers.size())
    P.fail("routes: " + std::to_string(entries.size()) + " entries (the '# routes' line lists " +
           std::to_string(h.layers.size()) + " layers)");
  out.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "routes at layer " + std::to_string(h.layers[i]);
    const size_t slash = entries[i].find('/');
    if (slash == std::string_view::npos) P.fail(at + ": expected 'ids/margin'");
    TraceRoute& x = out.emplace_back();
    for (auto id : Parser::split(entries[i].substr(0, slash), ','))
      x.ids.push_back(int32_t(P.integer(id, "routes expert id", 0, h.experts - 1)));
    if (int64_t(x.ids.size()) != h.top_k)
      P.fail(at + ": " + std::to_string(x.ids.size()) + " experts (top_k " +
             std::to_string(h.top_k) + ")");
    std::vector<int32_t> sorted = x.ids;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      P.fail(at + ": an expert is chosen twice");
    x.margin = P.number(entries[i].substr(slash + 1), "routes margin");
    if (x.margin < 0) P.fail(at + ": negative margin");
  }
}

void read_arbiter(Parser& P, const std::vector<std::string_view>& lines, Trace& t) {
  TraceHeader& h = t.header;
  std::unordered_set<std::string> seen;
  std::unordered_set<int64_t> positions;
  bool columns = false, ended = false;
  int64_t end_rows = -1, k = -1;
  for (size_t i = 1; i < lines.size(); ++i) {
    P.line = i + 1;
    std::string_view ln = lines[i];
    if (ended) P.fail("content after the '# end' line");
    if (ln.empty()) P.fail("empty line");
    if (ln[0] == '#') {
      if (ln.size() < 2 || ln[1] != ' ') P.fail("header line must start with '# '");
      auto v = Parser::split(ln.substr(2), '\t');
      std::string key(v[0]);
      v.erase(v.begin());
      if (key.empty()) P.fail("header line without a key");
      if (seen.count(key)) P.fail("duplicate '# " + key + "' line");
      seen.insert(key);
      if (key == "end") {
        P.arity(v, 4, key);
        P.keyword(v, 0, "rows", key);
        P.keyword(v, 2, "elapsed_s", key);
        end_rows = P.integer(v[1], "end rows", 0, INT64_MAX);
        t.elapsed_s = P.number(v[3], "elapsed_s");
        ended = true;
        continue;
      }
      if (columns) P.fail("header line '# " + key + "' after the '# columns' line");
      if (key == "arbiter-trace") {
        P.fail("second '# arbiter-trace' line");
      } else if (key == "model") {
        P.arity(v, 7, key);
        P.keyword(v, 1, "sha256", key);
        P.keyword(v, 3, "arch", key);
        P.keyword(v, 5, "params", key);
        h.model_path = Parser::str(v[0]);
        h.model_sha256 = Parser::str(v[2]);
        h.model_arch = Parser::str(v[4]);
        h.model_params = P.count(v[6], "params");
      } else if (key == "tokenizer") {
        P.arity(v, 4, key);
        P.keyword(v, 0, "sha256", key);
        P.keyword(v, 2, "bos", key);
        h.tokenizer_sha256 = Parser::str(v[1]);
        h.tokenizer_bos = Parser::str(v[3]);
        if (!h.tokenizer_bos.empty() && h.tokenizer_bos != "none")
          P.integer(v[3], "bos", 0, INT32_MAX);
      } else if (key == "corpus") {
        P.arity(v, 5, key);
        P.keyword(v, 1, "sha256", key);
        P.keyword(v, 3, "tokens", key);
        h.corpus_path = Parser::str(v[0]);
        h.corpus_sha256 = Parser::str(v[2]);
        h.corpus_tokens = P.count(v[4], "tokens");
      } else if (key == "shape") {
        P.arity(v, 11, key);
        const char* kws[] = {"chunk_tokens", "max_chunks", "topk", "prefill", "start_token"};
        int64_t* dst[] = {&h.chunk_tokens, &h.max_chunks, &h.topk, &h.prefill, &h.start_token};
        h.shape_name = Parser::str(v[0]);
        for (int j = 0; j < 5; ++j) {
          P.keyword(v, 1 + 2 * j, kws[j], key);
          *dst[j] = P.count(v[2 + 2 * j], kws[j]);
        }
        if (h.topk < 1) P.fail("'# shape' line: topk must be >= 1");
        k = h.topk;
      } else if (key == "device") {
        P.arity(v, 5, key);
        P.keyword(v, 1, "compute", key);
        P.keyword(v, 3, "weights", key);
        h.device = Parser::str(v[0]);
        h.compute = Parser::str(v[2]);
        h.weights = Parser::str(v[4]);
      } else if (key == "providers") {
        P.arity(v, 3, key);
        P.keyword(v, 1, "fallbacks", key);
        h.providers = Parser::str(v[0]);
        h.fallbacks = P.count(v[2], "fallbacks");
      } else if (key == "act_quant") {
        P.arity(v, 1, key);
        h.act_quant = std::string(v[0]);
      } else if (key == "inject") {
        P.arity(v, 1, key);
        h.inject = std::string(v[0]);
      } else if (key == "build") {
        P.arity(v, 4, key);
        h.build_version = Parser::str(v[0]);
        h.build_commit = Parser::str(v[1]);
        h.build_compiler = Parser::str(v[2]);
        h.build_cuda = Parser::str(v[3]);
      } else if (key == "env") {
        if (v.empty()) P.fail("'# env' line without a value (write 'none')");
        if (!(v.size() == 1 && v[0] == "none"))
          for (auto e : v) h.env.emplace_back(e);
      } else if (key == "routes") {
        P.arity(v, 8, key);
        P.keyword(v, 0, "experts", key);
        P.keyword(v, 2, "top_k", key);
        P.keyword(v, 4, "score", key);
        P.keyword(v, 6, "layers", key);
        h.routes.experts = P.integer(v[1], "routes experts", 1, INT32_MAX);
        h.routes.top_k = P.integer(v[3], "routes top_k", 1, h.routes.experts);
        h.routes.score = std::string(v[5]);
        for (auto x : Parser::split(v[7], ',')) {
          const int l = int(P.integer(x, "routes layer", 0, INT32_MAX));
          if (!h.routes.layers.empty() && l <= h.routes.layers.back())
            P.fail("'# routes' line: layers must be ascending without repeats");
          h.routes.layers.push_back(l);
        }
      } else if (key == "columns") {
        const bool routed = !h.routes.layers.empty();
        bool ok = v.size() == std::size(kColumns) + (routed ? 1 : 0);
        for (size_t j = 0; ok && j < std::size(kColumns); ++j) ok = v[j] == kColumns[j];
        if (ok && routed) ok = v.back() == kRoutesColumn;
        if (!routed && v.size() == std::size(kColumns) + 1 && v.back() == kRoutesColumn)
          P.fail("'# columns' line lists 'routes' but no '# routes' line came before it");
        if (!ok)
          P.fail(routed ? "'# columns' line does not list the v1 columns and 'routes' (the '# "
                          "routes' line asks for it)"
                        : "'# columns' line does not list the v1 columns");
        for (const char* req : {"model", "tokenizer", "corpus", "shape"})
          if (!seen.count(req)) P.fail(std::string("no '# ") + req + "' line before '# columns'");
        columns = true;
      } else {
        std::string rest;
        for (size_t j = 0; j < v.size(); ++j) {
          if (j) rest += '\t';
          rest += v[j];
        }
        h.extra.emplace_back(key, rest);
      }
      continue;
    }
    if (!columns) P.fail("row before the '# columns' line");
    auto c = Parser::split(ln, '\t');
    const size_t n_columns = std::size(kColumns) + (h.routes.layers.empty() ? 0 : 1);
    if (c.size() != n_columns)
      P.fail("row has " + std::to_string(c.size()) + " columns (expected " +
             std::to_string(n_columns) + ")");
    TraceRow r;
    r.chunk = int(P.integer(c[0], "chunk", 0, INT32_MAX));
    r.pos = int(P.integer(c[1], "pos", 0, INT32_MAX));
    r.abs_pos = P.integer(c[2], "abs_pos", 0, INT64_MAX);
    r.target = int32_t(P.integer(c[3], "target", 0, INT32_MAX));
    r.nll = P.number(c[4], "nll");
    r.target_logit = P.number(c[5], "target_logit");
    r.lse = P.number(c[6], "lse");
    if (!h.routes.layers.empty()) read_routes(P, c[9], h.routes, r.routes);
    add_row(P, t, std::move(r), c[7], c[8], true, k, positions);
  }
  if (!ended) {
    P.line = lines.size();
    P.fail("no '# end' line: the trace is incomplete");
  }
  if (end_rows != int64_t(t.rows.size())) {
    P.line = lines.size();
    P.fail("'# end' says " + std::to_string(end_rows) + " rows but the file holds " +
           std::to_string(t.rows.size()));
  }
}

// lines[first...] are the trace; lines before it were a preamble (line numbers stay the file's).
void read_foreign(Parser& P, const std::vector<std::string_view>& lines, size_t first, Trace& t) {
  t.format = TraceFormat::Foreign;
  t.has_abs_pos = t.has_target_logit = t.has_lse = false;
  std::unordered_set<int64_t> positions;
  bool header_seen = false;
  int64_t k = -1;
  for (size_t i = first; i < lines.size(); ++i) {
    P.line = i + 1;
    std::string_view ln = lines[i];
    if (!ln.empty() && ln.back() == '\r') ln.remove_suffix(1);  // CRLF files
    if (ln.empty()) P.fail("empty line");
    if (ln[0] == '#') {
      // Metadata of another engine: kept verbatim (key = first word), never interpreted.
      std::string_view body = ln.substr(1);
      while (!body.empty() && (body[0] == ' ' || body[0] == '\t')) body.remove_prefix(1);
      size_t e = body.find_first_of(" \t:=");
      std::string key(body.substr(0, e));
      std::string_view rest = e == std::string_view::npos ? std::string_view() : body.substr(e);
      while (!rest.empty() && (rest[0] == ' ' || rest[0] == '\t' || rest[0] == ':' || rest[0] == '='))
        rest.remove_prefix(1);
      t.header.extra.emplace_back(key, std::string(rest));
      continue;
    }
    auto c = Parser::split(ln, '\t');
    if (c.size() > 0 && c[0] == "chunk") {
      bool ok = c.size() == std::size(kForeignColumns);
      for (size_t j = 0; ok && j < c.size(); ++j) ok = c[j] == kForeignColumns[j];
      if (!ok) P.fail("column header is not 'chunk pos target nll top_ids top_logits'");
      if (header_seen || !t.rows.empty()) P.fail("column header after rows or repeated");
      header_seen = true;
      continue;
    }
    if (c.size() != std::size(kForeignColumns))
      P.fail("row has " + std::to_string(c.size()) +
             " columns (expected 6: chunk pos target nll top_ids top_logits)");
    TraceRow r;
    r.chunk = int(P.integer(c[0], "chunk", 0, INT32_MAX));
    r.pos = int(P.integer(c[1], "pos", 0, INT32_MAX));
    r.abs_pos = -1;
    r.target = int32_t(P.integer(c[2], "target", 0, INT32_MAX));
    r.nll = P.number(c[3], "nll");
    r.target_logit = r.lse = std::numeric_limits<double>::quiet_NaN();
    add_row(P, t, std::move(r), c[4], c[5], false, k, positions);
  }
  if (t.rows.empty()) {
    P.line = lines.size();
    P.fail("no rows (expected 'chunk pos target nll top_ids top_logits' lines)");
  }
  t.header.topk = k;
}

// A line that a foreign trace's reader takes as its own (a row or the column header): such a
// line starts the trace, so it is never part of a preamble.
bool is_foreign_data_line(std::string_view ln) {
  const auto c = Parser::split(ln, '\t');
  return c.size() == std::size(kForeignColumns) || c[0] == "chunk";
}

// The number of preamble lines before a foreign trace's first '#' line (0 when the file
// starts with a '#' line or a row). Some engines' trace tools print their loader's progress
// to the same stream as the trace, and their own scripts skip it; so do we, but only lines
// that cannot be trace data, and only a bounded amount, so that a file that is no trace at
// all is refused after at most kMaxPreambleLines lines or kMaxPreambleBytes bytes.
size_t preamble_length(Parser& P, const std::vector<std::string_view>& lines) {
  if (lines[0].substr(0, 1) == "#" || is_foreign_data_line(lines[0])) return 0;
  auto quoted_first = [&] {
    std::string_view f = lines[0];
    if (!f.empty() && f.back() == '\r') f.remove_suffix(1);
    return "'" + std::string(f.substr(0, 80)) + (f.size() > 80 ? "...'" : "'");
  };
  size_t bytes = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    bytes += lines[i].size() + 1;
    if (i >= kMaxPreambleLines || bytes > kMaxPreambleBytes) {
      P.line = 1;
      P.fail(strformat("not a trace: no '#' header line within the first %zu lines / %zu bytes (line 1: %s)",
                       kMaxPreambleLines, kMaxPreambleBytes, quoted_first().c_str()));
    }
    if (lines[i].substr(0, 1) == "#") return i;
    if (is_foreign_data_line(lines[i])) {
      P.line = i + 1;
      P.fail("a trace row after " + std::to_string(i) +
             " non-trace lines: a preamble is accepted only before a '#' header line");
    }
  }
  P.line = 1;
  P.fail(strformat("not a trace: no '#' header line or trace row in its %zu lines (line 1: %s)", lines.size(),
                   quoted_first().c_str()));
}

// The first preamble line as recorded: no CR, at most kPreambleFirstBytes bytes, cut on a
// UTF-8 character boundary (the file was checked to be valid UTF-8).
std::string preamble_first_line(std::string_view ln) {
  if (!ln.empty() && ln.back() == '\r') ln.remove_suffix(1);
  if (ln.size() <= kPreambleFirstBytes) return std::string(ln);
  size_t n = kPreambleFirstBytes;
  while (n > 0 && (static_cast<unsigned char>(ln[n]) & 0xC0) == 0x80) --n;
  return std::string(ln.substr(0, n));
}

}  // namespace

Trace read_trace(const std::string& path) {
  return parse_trace(read_input_file(path, "[trace]", kMaxInputBytes, "a trace"), path);
}

Trace parse_trace(const std::string& data, const std::string& path) {
  Parser P{path, 0};
  if (data.empty()) {
    P.line = 1;
    P.fail("empty file");
  }
  if (data.find('\0') != std::string::npos) {
    P.line = 1 + std::count(data.begin(), data.begin() + data.find('\0'), '\n');
    P.fail("NUL byte: not a text trace");
  }
  if (size_t bad = invalid_utf8_at(data); bad != std::string_view::npos) {
    P.line = 1 + std::count(data.begin(), data.begin() + long(bad), '\n');
    P.fail("byte " + std::to_string(bad) + " is not valid UTF-8");
  }
  std::string_view all(data);
  bool newline_at_end = all.back() == '\n';
  if (newline_at_end) all.remove_suffix(1);
  std::vector<std::string_view> lines = Parser::split(all, '\n');
  if (!newline_at_end) {
    // A writer always ends with a newline; a line without one was cut off mid-write.
    P.line = lines.size();
    P.fail("last line has no newline: the file is truncated");
  }
  Trace t;
  t.path = path;
  const size_t skip = preamble_length(P, lines);
  P.line = skip + 1;
  if (skip > 0 && lines[skip].substr(0, 15) == "# arbiter-trace") {
    // arbiter trace writes the header first into its own file (logs go to stderr), so lines
    // before it mean an edited or concatenated file: evidence of unknown origin.
    P.fail(std::to_string(skip) + " lines before '# arbiter-trace': an arbiter trace starts on line 1 "
           "(only foreign traces may carry a loader preamble)");
  }
  if (lines[0].substr(0, 16) == "# arbiter-trace\t") {
    int64_t v = P.integer(lines[0].substr(16), "format version", 0, INT32_MAX);
    if (v != kTraceFormatVersion)
      P.fail("unsupported arbiter-trace version " + std::to_string(v) + " (this reader knows " +
             std::to_string(kTraceFormatVersion) + ")");
    read_arbiter(P, lines, t);
  } else if (lines[0].substr(0, 15) == "# arbiter-trace") {
    P.fail("malformed '# arbiter-trace' line (expected '# arbiter-trace<TAB>1')");
  } else {
    t.preamble.lines = int64_t(skip);
    if (skip > 0) t.preamble.first = preamble_first_line(lines[0]);
    read_foreign(P, lines, skip, t);
  }
  return t;
}

// ---------------------------------------------------------------------------------------
// Full-logits side file.

void LogitsWriter::open(const std::string& path, uint32_t vocab) {
  ARB_CHECK(!file_.is_open(), "[logits] %s: writer already open", path.c_str());
  ARB_CHECK(vocab >= 1, "[logits] %s: vocab must be >= 1", path.c_str());
  vocab_ = vocab;
  rows_ = 0;
  uint8_t hdr[kLogitsHeaderBytes];
  std::memcpy(hdr, kLogitsMagic, 15);
  std::memcpy(hdr + 15, &kLogitsVersion, 4);
  std::memset(hdr + 19, 0, 8);  // rows, patched by finish()
  std::memcpy(hdr + 27, &vocab_, 4);
  file_.open(path, "[logits]");
  file_.write(hdr, sizeof hdr);
}

void LogitsWriter::write_row(const float* logits) {
  ARB_CHECK(file_.is_open(), "[logits] write_row before open");
  file_.write(logits, sizeof(float) * vocab_);
  ++rows_;
}

void LogitsWriter::finish() {
  ARB_CHECK(file_.is_open(), "[logits] finish before open");
  file_.write_at(19, &rows_, 8);
  file_.commit();
}

LogitsReader::LogitsReader(const std::string& path)
    : path_(path), f_(std::make_unique<InputFile>(path, "[logits]")) {
  uint8_t hdr[kLogitsHeaderBytes];
  auto fail = [&](const std::string& what) { throw Error("[logits] " + path + ": " + what); };
  if (f_->size() < sizeof hdr) fail("shorter than the 31-byte header");
  f_->read_at(0, hdr, sizeof hdr);
  if (std::memcmp(hdr, kLogitsMagic, 15) != 0) fail("bad magic (expected 'arbiter-logits\\0')");
  uint32_t version;
  std::memcpy(&version, hdr + 15, 4);
  std::memcpy(&rows_, hdr + 19, 8);
  std::memcpy(&vocab_, hdr + 27, 4);
  if (version != kLogitsVersion)
    fail("unsupported version " + std::to_string(version) + " (expected 1)");
  if (vocab_ == 0) fail("vocab is 0");
  const uint64_t size = f_->size();
  unsigned __int128 expected = (unsigned __int128)rows_ * vocab_ * 4 + kLogitsHeaderBytes;
  if (expected != (unsigned __int128)size)
    fail("size " + std::to_string(size) + " bytes does not match " + std::to_string(rows_) +
         " rows x " + std::to_string(vocab_) + " vocab (truncated or corrupt)");
}

LogitsReader::~LogitsReader() = default;

int64_t LogitsReader::read_row(uint64_t i, std::vector<float>& out) const {
  ARB_CHECK(i < rows_, "[logits] %s: row %llu out of range (rows %llu)", path_.c_str(),
            (unsigned long long)i, (unsigned long long)rows_);
  out.resize(vocab_);
  f_->read_at(kLogitsHeaderBytes + i * uint64_t(vocab_) * 4, out.data(), size_t(vocab_) * 4);
  int64_t nonfinite = 0;
  for (float v : out) nonfinite += !std::isfinite(v);
  return nonfinite;
}

}  // namespace arbiter::verify
