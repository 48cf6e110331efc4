// Trace store: add (copy + regenerate METADATA.txt, RUNS.txt, SHA256SUMS), verify, compare.
// The metadata files are regenerated from the traces' own headers on every add, so they can
// never drift from the evidence they describe.
#include "verify/trace/store.h"

#include "core/build_info.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "io/sha256.h"
#include "core/progress.h"

namespace arbiter::verify {

namespace fs = std::filesystem;

namespace {

bool reserved(const std::string& name) {
  return name == kStoreMetadata || name == kStoreRuns || name == kStoreSums;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Copies src into dir/name atomically; an existing dir/name must hold the same bytes.
void copy_in(const std::string& src, const std::string& dir, const std::string& name) {
  std::string dst = dir + "/" + name;
  if (fs::exists(dst)) {
    if (sha256_file(dst) != sha256_file(src))
      throw Error("[store] " + dst + ": already in the store with different content (from " +
                  src + ")");
    return;
  }
  InputFile in(src, "[store]");
  AtomicFile out;
  out.open(dst, "[store]");
  std::vector<char> buf(1 << 20);
  for (uint64_t at = 0; at < in.size(); at += buf.size()) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), in.size() - at));
    in.read_at(at, buf.data(), n);
    out.write(buf.data(), n);
  }
  out.commit();
}

std::string gpu_of(const std::string& device) {
  // "cuda:0 NVIDIA H200" -> "NVIDIA H200"; CPU tiers have no GPU.
  if (device.rfind("cuda", 0) != 0) return "";
  size_t sp = device.find(' ');
  return sp == std::string::npos ? device : device.substr(sp + 1);
}

std::string or_unknown(const std::string& s) { return s.empty() ? "unknown" : s; }
std::string or_unknown(int64_t v) { return v < 0 ? "unknown" : std::to_string(v); }

std::string extra_value(const TraceHeader& h, const std::string& key) {
  for (const auto& [k, v] : h.extra)
    if (k == key) return v;
  return "";
}

std::string metadata_text(const std::vector<std::pair<std::string, Trace>>& traces) {
  std::set<std::string> hosts, gpus, drivers, builds, models, tokenizers, corpora, shapes, envs;
  std::string per_trace;
  for (const auto& [name, t] : traces) {
    const TraceHeader& h = t.header;
    if (auto v = extra_value(h, "host"); !v.empty()) hosts.insert(v);
    if (auto g = gpu_of(h.device); !g.empty()) gpus.insert(g);
    if (auto v = extra_value(h, "driver"); !v.empty()) drivers.insert(v);
    builds.insert(or_unknown(h.build_version) + "\t" + or_unknown(h.build_commit) + "\t" +
                  or_unknown(h.build_compiler) + "\t" + or_unknown(h.build_cuda));
    models.insert(or_unknown(h.model_path) + "\tsha256\t" + or_unknown(h.model_sha256) +
                  "\tarch\t" + or_unknown(h.model_arch) + "\tparams\t" + or_unknown(h.model_params));
    tokenizers.insert("sha256\t" + or_unknown(h.tokenizer_sha256) + "\tbos\t" +
                      or_unknown(h.tokenizer_bos));
    corpora.insert(or_unknown(h.corpus_path) + "\tsha256\t" + or_unknown(h.corpus_sha256) +
                   "\ttokens\t" + or_unknown(h.corpus_tokens));
    shapes.insert(or_unknown(h.shape_name) + "\tchunk_tokens\t" + or_unknown(h.chunk_tokens) +
                  "\tmax_chunks\t" + or_unknown(h.max_chunks) + "\ttopk\t" + or_unknown(h.topk) +
                  "\tprefill\t" + or_unknown(h.prefill) + "\tstart_token\t" +
                  or_unknown(h.start_token));
    std::string env;
    for (const auto& e : h.env) env += (env.empty() ? "" : "\t") + e;
    envs.insert(env.empty() ? "none" : env);
    per_trace += "trace\t" + name + "\tshape\t" + or_unknown(h.shape_name) + "\tdevice\t" +
                 or_unknown(h.device) + "\tcompute\t" + or_unknown(h.compute) + "\tweights\t" +
                 or_unknown(h.weights) + "\tinject\t" + or_unknown(h.inject) + "\tfallbacks\t" +
                 or_unknown(h.fallbacks) + "\tproviders\t" + or_unknown(h.providers) + "\n";
  }
  char hn[256] = {0};
  if (::gethostname(hn, sizeof hn - 1) != 0) std::strcpy(hn, "unknown");
  std::string s;
  s += "# arbiter trace store; regenerated from the trace headers by `arbiter store add`\n";
  s += "store\t1\n";
  s += std::string("written_by\tarbiter ") + kVersion + "\t" + kGitCommit + "\n";
  s += std::string("store_host\t") + hn + "\n";
  auto list = [&](const char* key, const std::set<std::string>& vals, const char* none) {
    if (vals.empty()) s += std::string(key) + "\t" + none + "\n";
    for (const auto& v : vals) s += std::string(key) + "\t" + v + "\n";
  };
  list("host", hosts, "unknown (not recorded in the traces)");
  list("gpu", gpus, "none (no cuda device line in the traces)");
  list("driver", drivers, "unknown (not recorded in the traces)");
  list("build", builds, "unknown");
  list("model", models, "unknown");
  list("tokenizer", tokenizers, "unknown");
  list("corpus", corpora, "unknown");
  list("shape", shapes, "unknown");
  list("env", envs, "none");
  return s + per_trace;
}

std::string runs_text(const std::vector<std::pair<std::string, Trace>>& traces) {
  std::string s = "# trace\texit\trows\telapsed_s\tshape\tdevice\tnonfinite\n";
  for (const auto& [name, t] : traces)
    s += name + "\t" + (t.nonfinite_values ? "1" : "0") + "\t" + std::to_string(t.rows.size()) +
         "\t" + format_trace_float(t.elapsed_s) + "\t" + or_unknown(t.header.shape_name) + "\t" +
         or_unknown(t.header.device) + "\t" + std::to_string(t.nonfinite_values) + "\n";
  return s;
}

// Every non-hidden file except SHA256SUMS and temporaries of writes in progress, sorted.
std::vector<std::string> checked_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name != kStoreSums && name[0] != '.' && atomic_temp_pid(name) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> store_trace_names(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error("[store] " + dir + ": not a directory");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!e.is_regular_file() || reserved(name) || name[0] == '.' || ends_with(name, ".logits") ||
        atomic_temp_pid(name) > 0)
      continue;
    out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void store_add(const std::string& dir, const std::vector<std::string>& traces) {
  ARB_CHECK(!traces.empty(), "[store] add: no trace given");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("[store] " + dir + ": cannot create (" + ec.message() + ")");
  // Validate all inputs (and name clashes) before copying anything.
  std::set<std::string> names;
  for (const auto& p : traces) {
    std::string name = fs::path(p).filename().string();
    ARB_CHECK(names.insert(name).second, "[store] add: two traces named '%s'", name.c_str());
    std::string dst = dir + "/" + name;
    if (fs::exists(dst) && sha256_file(dst) != sha256_file(p))
      throw Error("[store] " + dst + ": already in the store with different content (from " + p +
                  ")");
    Trace t = read_trace(p);
    ARB_CHECK(t.format == TraceFormat::Arbiter,
              "[store] %s: a foreign trace cannot be stored (no '# end', no identity header)",
              p.c_str());
    ARB_CHECK(!reserved(name) && name[0] != '.' && !ends_with(name, ".logits"),
              "[store] %s: trace name '%s' is reserved", p.c_str(), name.c_str());
    if (fs::exists(logits_path_for(p))) {
      LogitsReader L(logits_path_for(p));
      ARB_CHECK(L.rows() == t.rows.size(), "[store] %s: %llu rows but its trace has %zu",
                logits_path_for(p).c_str(), (unsigned long long)L.rows(), t.rows.size());
    }
  }
  for (const auto& p : traces) {
    std::string name = fs::path(p).filename().string();
    copy_in(p, dir, name);
    if (fs::exists(logits_path_for(p))) copy_in(logits_path_for(p), dir, name + ".logits");
  }
  std::vector<std::pair<std::string, Trace>> all;
  for (const auto& name : store_trace_names(dir)) all.emplace_back(name, read_trace(dir + "/" + name));
  write_file_atomic(dir + "/" + kStoreMetadata, metadata_text(all), "[store]");
  write_file_atomic(dir + "/" + kStoreRuns, runs_text(all), "[store]");
  write_sha256sums(dir, "[store]");
}

void write_sha256sums(const std::string& dir, const std::string& component) {
  std::string sums;
  for (const auto& name : checked_files(dir)) sums += sha256_file(dir + "/" + name) + "  " + name + "\n";
  write_file_atomic(dir + "/" + kStoreSums, sums, component);
}

std::vector<std::string> check_sha256sums(const std::string& dir, bool progress) {
  std::vector<std::string> problems;
  auto problem = [&](const std::string& name, const std::string& what) {
    problems.push_back(dir + "/" + name + ": " + what);
  };
  std::error_code ec;
  // SHA256SUMS: every listed file exists and matches; every file is listed.
  std::map<std::string, std::string> sums;
  std::string text;
  try {
    text = read_input_file(dir + "/" + kStoreSums, "[store]", kMaxInputBytes, "a checksum list");
  } catch (const Error&) {
    problem(kStoreSums, "missing or unreadable");
  }
  size_t lineno = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string ln = text.substr(start, end - start);
    start = end + 1;
    ++lineno;
    bool ok = ln.size() > 66 && ln[64] == ' ' && (ln[65] == ' ' || ln[65] == '*') &&
              std::all_of(ln.begin(), ln.begin() + 64,
                          [](char c) { return std::isxdigit((unsigned char)c); });
    if (!ok) {
      problem(kStoreSums, "line " + std::to_string(lineno) + " is not '<sha256>  <name>'");
      continue;
    }
    sums[ln.substr(66)] = ln.substr(0, 64);
  }
  // Hashing is the long part (a full-logits file is GBs): progress over the bytes.
  int64_t total = 0, done = 0;
  for (const auto& [name, hex] : sums)
    if (name.find('/') == std::string::npos && fs::is_regular_file(dir + "/" + name, ec))
      total += int64_t(fs::file_size(dir + "/" + name, ec));
  Progress meter("store verify", total, "", Progress::Unit::Bytes, progress);
  for (const auto& [name, hex] : sums) {
    std::string p = dir + "/" + name;
    if (name.find('/') != std::string::npos || !fs::is_regular_file(p, ec)) {
      problem(name, "listed in SHA256SUMS but missing");
      continue;
    }
    try {
      auto on_read = [&](uint64_t n) { meter.update(done += int64_t(n)); };
      if (sha256_file(p, on_read) != hex) problem(name, "checksum mismatch (file changed or corrupt)");
    } catch (const Error& e) {
      problem(name, e.what());
    }
  }
  for (const auto& name : checked_files(dir))
    if (!sums.count(name)) problem(name, "not listed in SHA256SUMS");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name[0] == '.')
      problem(name, "stray hidden file");
    else if (atomic_temp_pid(name) > 0)
      problem(name, "stray temporary file (of an interrupted write, or of one in progress)");
  }
  return problems;
}

std::vector<std::string> store_verify(const std::string& dir, bool progress) {
  std::vector<std::string> problems;
  auto problem = [&](const std::string& name, const std::string& what) {
    problems.push_back(dir + "/" + name + ": " + what);
  };
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {dir + ": not a directory"};

  problems = check_sha256sums(dir, progress);
  for (const char* req : {kStoreMetadata, kStoreRuns})
    if (!fs::exists(dir + "/" + req)) problem(req, "missing");

  // Traces: complete, row counts as in `# end`, rows inside their shape, RUNS.txt agrees.
  std::map<std::string, std::pair<int64_t, int64_t>> runs;  // name -> (exit, rows)
  try {
    std::string rt = read_input_file(dir + "/" + kStoreRuns, "[store]", kMaxInputBytes, "a run list");
    size_t s0 = 0;
    while (s0 < rt.size()) {
      size_t e = rt.find('\n', s0);
      if (e == std::string::npos) e = rt.size();
      std::string ln = rt.substr(s0, e - s0);
      s0 = e + 1;
      if (ln.empty() || ln[0] == '#') continue;
      size_t t1 = ln.find('\t'), t2 = ln.find('\t', t1 + 1), t3 = ln.find('\t', t2 + 1);
      if (t1 == std::string::npos || t2 == std::string::npos || t3 == std::string::npos) {
        problem(kStoreRuns, "malformed line '" + ln + "'");
        continue;
      }
      runs[ln.substr(0, t1)] = {std::atoll(ln.substr(t1 + 1, t2 - t1 - 1).c_str()),
                                std::atoll(ln.substr(t2 + 1, t3 - t2 - 1).c_str())};
    }
  } catch (const Error&) {
  }
  std::vector<std::string> names;
  try {
    names = store_trace_names(dir);
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  for (const auto& name : names) {
    Trace t;
    try {
      t = read_trace(dir + "/" + name);
    } catch (const Error& e) {
      problem(name, e.what());
      continue;
    }
    if (t.format != TraceFormat::Arbiter) {
      problem(name, "not an arbiter trace");
      continue;
    }
    const TraceHeader& h = t.header;
    for (const auto& r : t.rows) {
      if ((h.chunk_tokens >= 0 && r.pos >= h.chunk_tokens) ||
          (h.max_chunks >= 0 && r.chunk >= h.max_chunks)) {
        problem(name, strformat("row chunk %d pos %d lies outside its shape (%lld chunks of %lld)",
                                r.chunk, r.pos, (long long)h.max_chunks, (long long)h.chunk_tokens));
        break;
      }
    }
    auto it = runs.find(name);
    if (it == runs.end()) {
      problem(name, "no line in RUNS.txt");
    } else {
      int64_t exit = t.nonfinite_values ? 1 : 0;
      if (it->second.second != int64_t(t.rows.size()) || it->second.first != exit)
        problem(name, strformat("RUNS.txt says exit %lld rows %lld, trace has exit %lld rows %zu",
                                (long long)it->second.first, (long long)it->second.second,
                                (long long)exit, t.rows.size()));
      runs.erase(it);
    }
    std::string lp = dir + "/" + name + ".logits";
    if (fs::exists(lp)) {
      try {
        LogitsReader L(lp);
        if (L.rows() != t.rows.size())
          problem(name + ".logits", strformat("%llu rows but its trace has %zu",
                                              (unsigned long long)L.rows(), t.rows.size()));
      } catch (const Error& e) {
        problem(name + ".logits", e.what());
      }
    }
  }
  for (const auto& [name, v] : runs) problem(kStoreRuns, "lists '" + name + "' which is not a trace here");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (ends_with(name, ".logits") &&
        !fs::exists(dir + "/" + name.substr(0, name.size() - 7)))
      problem(name, "logits file without its trace");
  }
  return problems;
}

StoreComparison store_compare(const std::string& ref_dir, const std::string& cand_dir,
                              const CompareOptions& opt, bool topk_only) {
  StoreComparison out;
  for (const auto& d : {ref_dir, cand_dir})
    for (auto& p : store_verify(d)) out.problems.push_back(p);
  if (!out.problems.empty()) {
    out.worst = Verdict::Unreadable;
    return out;
  }
  struct Item {
    std::string name;
    Trace trace;
  };
  auto load = [](const std::string& dir) {
    std::vector<Item> items;
    for (const auto& n : store_trace_names(dir)) items.push_back({n, read_trace(dir + "/" + n)});
    return items;
  };
  std::vector<Item> refs = load(ref_dir), cands = load(cand_dir);
  std::vector<bool> cand_used(cands.size(), false);
  for (const auto& r : refs) {
    bool paired = false;
    for (size_t j = 0; j < cands.size(); ++j) {
      const auto& c = cands[j];
      if (c.trace.header.shape_name != r.trace.header.shape_name ||
          c.trace.header.model_sha256 != r.trace.header.model_sha256)
        continue;
      paired = true;
      cand_used[j] = true;
      StorePair p;
      p.shape = r.trace.header.shape_name;
      p.model_sha256 = r.trace.header.model_sha256;
      p.ref_name = r.name;
      p.cand_name = c.name;
      CompareOptions o = opt;
      o.ref_label = ref_dir + "/" + r.name;
      o.cand_label = cand_dir + "/" + c.name;
      std::string lr = logits_path_for(o.ref_label), lc = logits_path_for(o.cand_label);
      if (!topk_only && fs::exists(lr) && fs::exists(lc)) {
        o.ref_logits = lr;
        o.cand_logits = lc;
      }
      try {
        p.result = compare_traces(r.trace, c.trace, o);
        p.verdict = p.result.verdict;
      } catch (const Error& e) {
        p.error = e.what();
        p.verdict = Verdict::Unreadable;
      }
      out.worst = worse_verdict(out.worst, p.verdict);
      out.pairs.push_back(std::move(p));
    }
    if (!paired) {
      out.unpaired.push_back(ref_dir + "/" + r.name + " (shape " + r.trace.header.shape_name +
                             ", no candidate of this shape and model)");
      out.worst = worse_verdict(out.worst, Verdict::Inconclusive);
    }
  }
  for (size_t j = 0; j < cands.size(); ++j)
    if (!cand_used[j]) {
      out.unpaired.push_back(cand_dir + "/" + cands[j].name + " (shape " +
                             cands[j].trace.header.shape_name + ", no reference of this shape and model)");
      out.worst = worse_verdict(out.worst, Verdict::Inconclusive);
    }
  if (refs.empty() && cands.empty()) out.worst = Verdict::Inconclusive;
  return out;
}

std::string format_store_comparison(const StoreComparison& c) {
  std::string s;
  for (const auto& p : c.problems) s += "PROBLEM " + p + "\n";
  if (!c.pairs.empty())
    s += strformat("%-10s %-12s %-24s %-24s %8s %8s %6s %9s %11s %10s %s\n", "shape", "model",
                   "ref", "cand", "pos", "decided", "dis", "maxgap", "ppl_diff%", "kl_mean",
                   "verdict");
  auto num = [](double v, const char* f) { return std::isfinite(v) ? strformat(f, v) : std::string("-"); };
  for (const auto& p : c.pairs) {
    const CompareResult& r = p.result;
    s += strformat("%-10s %-12s %-24s %-24s %8lld %8lld %6lld %9s %11s %10s %s%s\n", p.shape.c_str(),
                   p.model_sha256.substr(0, 12).c_str(), p.ref_name.c_str(), p.cand_name.c_str(),
                   (long long)r.positions, (long long)r.decided, (long long)r.decided_disagree,
                   num(r.max_gap_at_disagreement, "%.4g").c_str(), num(r.ppl_diff_pct, "%+.4f").c_str(),
                   num(r.kl.mean, "%.3g").c_str(), verdict_name(p.verdict),
                   r.forced ? " (forced)" : "");
    if (!p.error.empty()) s += "    " + p.error + "\n";
    if (r.routes.recorded) s += format_route_flips(r.routes, "    ");
    if (p.verdict == Verdict::Incomparable)
      for (const auto& why : r.reasons) s += "    " + why + "\n";
  }
  for (const auto& u : c.unpaired) s += "UNPAIRED " + u + "\n";
  s += std::string("WORST: ") + verdict_name(c.worst) + "\n";
  return s;
}

nlohmann::json to_json(const StoreComparison& c) {
  nlohmann::json j;
  j["verdict"] = verdict_name(c.worst);
  j["exit_code"] = int(c.worst);
  j["problems"] = c.problems;
  j["unpaired"] = c.unpaired;
  j["pairs"] = nlohmann::json::array();
  for (const auto& p : c.pairs) {
    nlohmann::json e = {{"shape", p.shape}, {"model_sha256", p.model_sha256}, {"ref", p.ref_name},
                        {"cand", p.cand_name}, {"verdict", verdict_name(p.verdict)}};
    if (!p.error.empty()) e["error"] = p.error;
    else e["result"] = to_json(p.result);
    j["pairs"].push_back(e);
  }
  return j;
}

}  // namespace arbiter::verify
