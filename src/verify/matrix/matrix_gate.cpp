// Matrix token gate: the gate's options from the spec, resumable runs into DIR/gate-<model>.json,
// the report rebuilt from those files (so `matrix report DIR` needs no model), its section.
#include "verify/matrix/matrix_gate.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "core/error.h"
#include "engine/probe.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "io/sha256.h"
#include "verify/localize/gate_record.h"
#include "verify/localize/side.h"
#include "verify/matrix/matrix_doc.h"
#include "verify/matrix/matrix_files.h"

namespace arbiter::verify {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The side text (verify/localize/side.h) of a local arm: DEVICE[:DTYPE][+inject=..][+mix=..].
std::string arm_side(const MatrixArm& a) {
  std::string s = a.device + (a.dtype.empty() ? "" : ":" + a.dtype);
  if (a.inject != "none") s += "+inject=" + a.inject;
  if (!a.mix.empty()) s += "+mix=" + a.mix;
  return s;
}

// What the spec asks of model m's gate; a kept file must ask the same (the prompts' bytes are
// compared apart, by sha256, where the prompts file is at hand).
json asked(const MatrixSpec& spec, size_t m) {
  const MatrixGate& g = spec.gate;
  json sides = json::array();
  for (const auto& a : g.arms) sides.push_back(arm_side(spec.arm(a)));
  return {{"model", spec.models[m]}, {"arms", g.arms},       {"sides", sides},
          {"against", g.against},    {"prompts", g.prompts}, {"n", g.n_tokens},
          {"runs", g.runs},          {"band", g.band},       {"threads", g.threads},
          {"localize", g.localize}};
}

// Why a gate file's "asked" differs from the spec's ("" = it matches).
std::string asked_mismatch(const json& got, const json& want) {
  for (const auto& [k, v] : want.items())
    if (!got.contains(k) || got[k] != v)
      return "its " + k + " is " + (got.contains(k) ? got[k].dump() : "absent") +
             ", the spec asks for " + v.dump();
  return "";
}

int side_index(const std::map<std::string, int>& idx, const json& label) {
  auto it = idx.find(label.get<std::string>());
  if (it == idx.end()) throw Error("names side " + label.dump() + ", which is not in \"sides\"");
  return it->second;
}

// `s` as inline code. A token piece may hold backticks: CommonMark then needs a fence longer
// than its longest run of them, and spaces inside when it starts or ends with one. Built by
// appending, which also keeps gcc 12 from a false -Wrestrict on operator+ chains.
std::string code(const std::string& s) {
  size_t run = 0, longest = 0;
  for (char c : s) longest = std::max(longest, run = c == '`' ? run + 1 : 0);
  const std::string fence(longest + 1, '`');
  const bool pad = !s.empty() && (s.front() == '`' || s.back() == '`');
  std::string o;
  o.reserve(s.size() + 2 * fence.size() + 2);
  o += fence;
  if (pad) o += ' ';
  o += s;
  if (pad) o += ' ';
  o += fence;
  return o;
}

double num_or_nan(const json& v) { return v.is_null() ? NAN : v.get<double>(); }

// A number of gate_localize_json: finite ones are numbers, the others the strings "nan",
// "inf" or "-inf".
double localize_num(const json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string t = v.get<std::string>();
  if (t == "nan") return NAN;
  if (t == "inf") return INFINITY;
  if (t == "-inf") return -INFINITY;
  throw Error("a localize number " + v.dump());
}

std::vector<TopToken> localize_tops(const json& a) {
  if (!a.is_array()) throw Error("a top-5 that is no array");
  std::vector<TopToken> v;
  for (const json& t : a)
    v.push_back({t.at("id").get<int32_t>(), t.at("piece").get<std::string>(),
                 localize_num(t.at("logit"))});
  return v;
}

// The file's "localize" as gate_localize_json() and gate_file_json() wrote it; the side must
// be one of the gate's and the class one localize_class() gives.
void localize_from_file(const json& l, const GateReport& r, MatrixGateResult* out) {
  std::vector<MatrixLocalized> items;
  for (const json& d : l.at("divergences")) {
    MatrixLocalized x;
    x.side = d.at("side").get<std::string>();
    bool known = false;
    for (const GateSideSummary& s : r.sides) known = known || s.label == x.side;
    if (!known) throw Error("localize names side \"" + x.side + "\", which is not in \"sides\"");
    x.cls = d.at("class").get<std::string>();
    bool cls_known = false;
    for (LocalizeClass c : {LocalizeClass::NearTieFlip, LocalizeClass::LocalizedDefect,
                            LocalizeClass::Unexplained})
      cls_known = cls_known || x.cls == localize_class_name(c);
    if (!cls_known) throw Error("localize class \"" + x.cls + "\"");
    x.prompt = d.at("prompt").get<int>();
    x.step = d.at("step").get<int>();
    x.ref_top = localize_tops(d.at("ref_top"));
    x.side_top = localize_tops(d.at("side_top"));
    x.ref_gap = localize_num(d.at("ref_gap"));
    x.deficit = localize_num(d.at("deficit"));
    x.ref_rank_in_side = d.at("ref_rank_in_side").get<int>();
    const json& dr = d.at("drift");
    if (const json& f = dr.at("first_flagged"); !f.is_null()) {
      x.first_stage = f.at("stage").get<std::string>();
      x.first_op = f.at("op").get<std::string>();
      x.first_layer = f.at("layer").get<int>();
    }
    if ((x.cls == localize_class_name(LocalizeClass::LocalizedDefect)) == x.first_stage.empty())
      throw Error("localize class \"" + x.cls + "\" and first_flagged " +
                  dr.at("first_flagged").dump() + " disagree");
    x.max_ratio = localize_num(dr.at("max_local_over_bound"));
    if (const json& w = dr.at("max_at"); !w.is_null()) {
      x.max_stage = w.at("stage").get<std::string>();
      x.max_layer = w.at("layer").get<int>();
    }
    const json& g = dr.at("growth");
    x.growth_kind = g.at("kind").get<std::string>();
    if (x.growth_kind != "jump" && x.growth_kind != "uniform" && x.growth_kind != "none")
      throw Error("localize growth kind \"" + x.growth_kind + "\"");
    x.growth_layer = g.at("layer").get<int>();
    x.growth = localize_num(g.at("factor"));
    x.growth_ratio = localize_num(g.at("local_over_bound"));
    x.jump_factor = localize_num(g.at("jump_factor"));
    items.push_back(std::move(x));
  }
  const int skipped = l.at("recorded_skipped").get<int>();
  if (!out) return;
  out->localized = true;
  out->localize = std::move(items);
  out->localize_recorded_skipped = skipped;
  out->localize_json = l;
}

// The gate report as gate_json() wrote it, with what gate_json leaves out (which sides were
// recorded, the token texts) from the matrix file around it.
GateReport report_from_file(const json& f) {
  const json& j = f.at("gate");
  GateReport r;
  const int code = j.at("exit_code").get<int>();
  if (code < 0 || code > int(Verdict::Unreadable)) throw Error("exit_code " + std::to_string(code));
  r.verdict = Verdict(code);
  r.verdict_reason = j.at("reason").get<std::string>();
  r.model_path = j.at("model").get<std::string>();
  r.prompts_path = j.at("prompts").at("path").get<std::string>();
  r.prompts_sha256 = j.at("prompts").at("sha256").get<std::string>();
  r.n_prompts = j.at("prompts").at("count").get<int>();
  r.n_tokens = j.at("tokens").get<int>();
  r.runs = j.at("runs").get<int>();
  r.band = j.at("band").get<double>();
  r.tokenizers_agree = j.at("tokenizer").at("agree").get<bool>();
  r.tokenizer_note = j.at("tokenizer").at("note").get<std::string>();
  const json& recorded = f.at("recorded");
  std::map<std::string, int> idx;
  for (const json& s : j.at("sides")) {
    GateSideSummary g;
    g.label = s.at("side").get<std::string>();
    g.device = s.at("device").get<std::string>();
    g.compute = s.at("compute").get<std::string>();
    g.inject = s.at("inject").get<std::string>();
    g.consistent = s.at("consistent").get<bool>();
    g.diverged = s.at("diverged").get<int>();
    g.near_ties = s.at("near_ties").get<int>();
    g.defects = s.at("defects").get<int>();
    g.recorded = recorded.at(r.sides.size()).get<bool>();
    if (!idx.emplace(g.label, int(r.sides.size())).second)
      throw Error("side '" + g.label + "' is listed twice");
    r.sides.push_back(g);
  }
  if (recorded.size() != r.sides.size())
    throw Error("\"recorded\" does not hold one flag per side");
  for (const json& in : j.at("inconsistencies"))
    r.inconsistencies.push_back({side_index(idx, in.at("side")), in.at("prompt").get<int>() - 1,
                                 in.at("run").get<int>() - 1, in.at("step").get<int>(),
                                 in.at("run0_token").get<int32_t>(),
                                 in.at("run_token").get<int32_t>()});
  for (const json& d : j.at("divergences")) {
    GateDivergence g;
    g.side = side_index(idx, d.at("side"));
    g.prompt = d.at("prompt").get<int>() - 1;
    g.step = d.at("step").get<int>();
    g.j.ref_token = d.at("ref_token").get<int32_t>();
    g.j.side_token = d.at("side_token").get<int32_t>();
    g.j.ref_top1 = d.at("ref_top1").get<int32_t>();
    g.j.ref_top2 = d.at("ref_top2").get<int32_t>();
    g.j.ref_gap = num_or_nan(d.at("ref_gap"));
    g.j.side_rank = d.at("side_rank").get<int>();
    g.j.deficit = num_or_nan(d.at("deficit"));
    g.j.side_logprob = num_or_nan(d.at("side_logprob"));
    g.j.near_tie = d.at("class").get<std::string>() == "near-tie";
    g.side_own_gap = num_or_nan(d.at("side_own_gap"));
    g.counts = d.at("judged").get<bool>();
    r.divergences.push_back(g);
  }
  for (const json& c : j.at("contested")) {
    GateContested g;
    g.prompt = c.at("prompt").get<int>() - 1;
    g.step = c.at("step").get<int>();
    for (const json& grp : c.at("groups")) {
      g.tokens.push_back(grp.at("token").get<int32_t>());
      g.groups.emplace_back();
      for (const json& s : grp.at("sides")) g.groups.back().push_back(side_index(idx, s));
    }
    if (g.groups.empty()) throw Error("a contested step without groups");
    for (const json& s : c.at("left_earlier")) g.left_earlier.push_back(side_index(idx, s));
    r.contested.push_back(g);
  }
  for (const auto& [id, text] : f.at("pieces").items())
    r.pieces[int32_t(std::stol(id))] = text.get<std::string>();
  return r;
}

// Reads and checks a gate file: the format, the report, then the localization when the file
// asked for one. Throws Error "FILE: problem".
json read_gate_file(const std::string& path, MatrixGateResult* out) {
  json f;
  try {
    f = json::parse(read_input_file(path, "[matrix]", kMaxInputBytes, "a matrix gate file"));
    if (f.at("format") != kMatrixGateFormat || f.at("version") != kMatrixGateVersion)
      throw Error("format " + f.at("format").dump() + " version " + f.at("version").dump() +
                  ", expected " + kMatrixGateFormat + " " + std::to_string(kMatrixGateVersion));
    GateReport r = report_from_file(f);
    if (f.at("asked").value("localize", false)) localize_from_file(f.at("localize"), r, out);
    if (out) out->report = std::move(r);
  } catch (const json::exception& e) {
    throw Error("[matrix] " + path + ": not a matrix gate file (" + e.what() + ")");
  } catch (const std::logic_error&) {  // std::stol of a "pieces" key
    throw Error("[matrix] " + path + ": not a matrix gate file (a token id that is no int)");
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("[matrix] ", 0) == 0) throw;
    throw Error("[matrix] " + path + ": not a matrix gate file (" + what + ")");
  }
  return f;
}

// Why a cuda arm of the gate cannot run here ("" = every arm can).
std::string gpu_skip_reason(const MatrixSpec& spec) {
  for (const auto& name : spec.gate.arms) {
    const MatrixArm& a = spec.arm(name);
    if (!a.is_gpu()) continue;
    DeviceSpec ds;
    ds.device = a.device;
    ds.dtype = a.dtype;
    try {
      make_tier(ds);
    } catch (const Error& e) {
      if (matrix_gpu_unavailable(e.what())) return "arm '" + name + "': " + e.what();
    }
  }
  return "";
}

GateOptions gate_options(const MatrixSpec& spec, size_t m, const MatrixRunOptions& opt) {
  GateOptions go;
  go.model_path = spec.models[m];
  go.prompts_path = spec.gate.prompts_path;
  go.n_tokens = spec.gate.n_tokens;
  go.runs = spec.gate.runs;
  go.band = spec.gate.band;
  go.threads = spec.gate.threads;
  for (const auto& name : spec.gate.arms) {
    Side s = parse_side(arm_side(spec.arm(name)));
    s.label = name;  // the report names arms, as every other table of the matrix does
    go.sides.push_back(s);
  }
  for (const auto& dir : spec.gate.against_paths)
    for (GateRecordedSide& rs : gate_record_read(dir)) go.recorded.push_back(std::move(rs));
  go.progress = opt.progress;
  return go;
}

std::string fnum(double x) { return std::isfinite(x) ? strformat("%.4g", x) : strformat("%g", x); }

// The stage a drift row names: "stage (op OP, layer L)", as gate --localize prints it.
std::string stage_text(const std::string& stage, const std::string& op, int layer) {
  return code(stage) + (op.empty() ? "" : " (op " + code(op)) +
         (layer >= 0 ? ", layer " + std::to_string(layer) : "") + (op.empty() ? "" : ")");
}

// Each localized divergence of a gate: a paragraph with its class and drift summary, and the
// two sides' top-5 at the judged step side by side.
void localize_blocks(const MatrixGateResult& g, const std::string& model, Doc& d) {
  const GateReport& r = g.report;
  d.para(strformat(
      "**Localization** (drift between the reference `%s` and the diverging side on each "
      "divergence's prefix, one forward whose last position is the judged step; classes of "
      "docs/localize.md):%s",
      r.sides.front().label.c_str(),
      g.localize.empty() ? " no counted divergence to localize." : ""));
  if (g.localize_recorded_skipped)
    d.para(std::to_string(g.localize_recorded_skipped) +
           " divergence(s) of recorded sides not localized: their tiers did not run here.");
  for (size_t i = 0; i < g.localize.size(); ++i) {
    const MatrixLocalized& x = g.localize[i];
    const std::string first =
        x.first_stage.empty() ? "none" : stage_text(x.first_stage, x.first_op, x.first_layer);
    std::string growth = "no layers";
    if (x.growth_kind == "jump")
      growth = strformat("jump at layer %d (accumulated error x%s over the layer, local/bound %s)",
                         x.growth_layer, fnum(x.growth).c_str(), fnum(x.growth_ratio).c_str());
    else if (x.growth_kind == "uniform")
      growth = strformat("uniform (largest growth x%s at layer %d; a jump needs > x%s with "
                         "local/bound > 1)",
                         fnum(x.growth).c_str(), x.growth_layer, fnum(x.jump_factor).c_str());
    // Both other classes are past the band, so gate defects: FAIL as in the divergences table.
    const std::string cls =
        (x.cls == localize_class_name(LocalizeClass::NearTieFlip) ? "" : "FAIL ") + x.cls;
    const std::string at =
        x.max_stage.empty() ? "" : " at " + stage_text(x.max_stage, "", x.max_layer);
    d.para(strformat("Side `%s`, prompt %d, step %d: **%s**. First stage over its bound: %s; "
                     "max local/bound %s%s; growth: %s. Reference top-1/top-2 gap %.4f nats; the "
                     "side ranks the reference's token %d; gate deficit %.4f.",
                     x.side.c_str(), x.prompt, x.step, cls.c_str(), first.c_str(),
                     fnum(x.max_ratio).c_str(), at.c_str(), growth.c_str(), x.ref_gap,
                     x.ref_rank_in_side, x.deficit));
    std::vector<std::vector<std::string>> t = {
        {"rank", "reference " + code(r.sides.front().label), "logit", "side " + code(x.side),
         "logit"}};
    for (size_t k = 0; k < std::max(x.ref_top.size(), x.side_top.size()); ++k) {
      t.push_back({std::to_string(k + 1)});
      for (const auto* v : {&x.ref_top, &x.side_top}) {
        if (k >= v->size()) {
          t.back().insert(t.back().end(), {"", ""});
          continue;
        }
        const TopToken& tok = (*v)[k];
        t.back().push_back(
            code(strformat("'%s'(%d)", printable_piece(tok.piece).c_str(), int(tok.id))));
        t.back().push_back(strformat("%.6f", tok.logit));
      }
    }
    d.table(t, "gate-localize-" + model + "-" + std::to_string(i + 1));
  }
}

json gate_file_json(const MatrixSpec& spec, size_t m, const GateReport& r) {
  json recorded = json::array(), pieces = json::object();
  for (const GateSideSummary& s : r.sides) recorded.push_back(s.recorded);
  for (const auto& [id, text] : r.pieces) pieces[std::to_string(id)] = text;
  return {{"format", kMatrixGateFormat}, {"version", kMatrixGateVersion},
          {"asked", asked(spec, m)},     {"prompts_sha256", r.prompts_sha256},
          {"gate", gate_json(r)},        {"recorded", recorded},
          {"pieces", pieces}};
}

}  // namespace

std::string matrix_gate_file(const MatrixSpec& spec, size_t m) {
  return "gate-" + matrix_model_name(spec.models[m]) + ".json";
}

std::string matrix_gate_stale(const MatrixSpec& spec, size_t m, const std::string& path) {
  json f;
  try {
    f = read_gate_file(path, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  std::string why = asked_mismatch(f.at("asked"), asked(spec, m));
  if (!why.empty()) return why;
  const std::string sha = sha256_file(spec.gate.prompts_path);
  if (f.at("prompts_sha256") != sha)
    return "its prompts sha256 is " + f.at("prompts_sha256").dump() + ", " +
           spec.gate.prompts_path + " has " + sha;
  return "";
}

std::vector<MatrixGateRun> matrix_run_gates(const MatrixSpec& spec, const MatrixRunOptions& opt,
                                            const std::string& only_model) {
  std::vector<MatrixGateRun> runs;
  if (!spec.has_gate) return runs;
  bool found = only_model.empty();
  for (const auto& m : spec.models) found = found || matrix_model_name(m) == only_model;
  if (!found) throw Error("[matrix] " + spec.path + ": no model named '" + only_model + "'");
  std::string gpu_skip;  // the same for every model: the arms are the same
  bool gpu_checked = false;
  for (size_t m = 0; m < spec.models.size(); ++m) {
    if (!only_model.empty() && matrix_model_name(spec.models[m]) != only_model) continue;
    MatrixGateRun g;
    g.model = m;
    g.file = matrix_gate_file(spec, m);
    const std::string path = opt.out_dir + "/" + g.file;
    auto log = [&](const std::string& what, const std::string& why) {
      if (opt.progress)
        std::fprintf(stderr, "[matrix] gate %zu/%zu %s: %s%s%s\n", m + 1, spec.models.size(),
                     g.file.c_str(), what.c_str(), why.empty() ? "" : ": ", why.c_str());
    };
    auto t0 = std::chrono::steady_clock::now();
    try {
      if (fs::exists(path)) {
        g.reason = matrix_gate_stale(spec, m, path);
        if (g.reason.empty()) {
          g.status = MatrixTraceStatus::Kept;
          log("kept", "");
          runs.push_back(g);
          continue;
        }
        log("redo", g.reason);
        fs::remove(path);
      }
      if (!gpu_checked) gpu_skip = gpu_skip_reason(spec), gpu_checked = true;
      if (!gpu_skip.empty()) {
        g.status = MatrixTraceStatus::Skipped;
        g.reason = gpu_skip;
        log("SKIP", g.reason);
        runs.push_back(g);
        continue;
      }
      const GateOptions go = gate_options(spec, m, opt);
      const GateReport r = run_gate(go);
      json f = gate_file_json(spec, m, r);
      if (spec.gate.localize) {
        const GateLocalizeReport l = run_gate_localize(go, r);
        f["localize"] = {{"divergences", gate_localize_json(l)},
                         {"recorded_skipped", l.recorded_skipped}};
      }
      write_file_atomic(path, f.dump(1) + "\n", "[matrix]");
      g.status = MatrixTraceStatus::Ran;
      g.reason.clear();
    } catch (const Error& e) {
      g.status = MatrixTraceStatus::Failed;
      g.reason = e.what();
    }
    g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (g.status == MatrixTraceStatus::Ran)
      log(strformat("ran in %.1f s", g.seconds), "");
    else
      log("FAILED", g.reason);
    runs.push_back(g);
  }
  return runs;
}

std::vector<MatrixGateResult> matrix_gate_results(const MatrixSpec& spec, const std::string& dir,
                                                  bool require_cuda) {
  std::vector<MatrixGateResult> out;
  if (!spec.has_gate) return out;
  const auto status = read_status(dir);
  for (size_t m = 0; m < spec.models.size(); ++m) {
    MatrixGateResult g;
    g.model = m;
    g.file = matrix_gate_file(spec, m);
    const std::string path = dir + "/" + g.file;
    auto st = status.find(g.file);
    if (fs::exists(path)) {
      try {
        json f = read_gate_file(path, &g);
        g.why = asked_mismatch(f.at("asked"), asked(spec, m));
        if (g.why.empty()) {
          g.state = MatrixGateResult::State::Done;
          g.verdict = g.report.verdict;
        } else {
          g.state = MatrixGateResult::State::Error;
          g.verdict = Verdict::Incomparable;
          g.why = g.file + " does not match the spec: " + g.why;
        }
      } catch (const Error& e) {
        g.state = MatrixGateResult::State::Error;
        g.verdict = Verdict::Unreadable;
        g.why = e.what();
      }
    } else if (st != status.end() && st->second.first == "skipped") {
      g.state = MatrixGateResult::State::Skipped;
      g.why = st->second.second;
      g.counted = require_cuda;
      g.verdict = require_cuda ? Verdict::Fail : Verdict::Inconclusive;
    } else if (st != status.end()) {
      g.state = MatrixGateResult::State::Error;
      g.verdict = Verdict::Unreadable;
      g.why = "the gate failed: " + st->second.second;
    } else {
      g.why = "not run (arbiter matrix run writes " + g.file + ")";
    }
    out.push_back(std::move(g));
  }
  return out;
}

std::string matrix_gate_finding(const MatrixSpec& spec, const MatrixGateResult& g) {
  if (!g.counted || g.verdict == Verdict::Pass) return "";
  std::string what = "token gate on " + matrix_model_name(spec.models[g.model]) + ": ";
  if (g.state != MatrixGateResult::State::Done)
    return what + verdict_name(g.verdict) + " — " + g.why;
  if (g.verdict != Verdict::Fail)
    return what + verdict_name(g.verdict) + " — " + g.report.verdict_reason;
  std::string sides;
  for (const GateSideSummary& s : g.report.sides)
    if (s.defects > 0)
      sides += (sides.empty() ? "`" : ", `") + s.label + "` " + std::to_string(s.defects) +
               " defect(s)";
  return what + sides + " (" + g.report.verdict_reason + ")";
}

std::string matrix_gate_note(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates) {
  bool all_passed = !gates.empty();
  std::string skipped, why;
  for (const MatrixGateResult& g : gates) {
    all_passed = all_passed && g.state == MatrixGateResult::State::Done &&
                 g.verdict == Verdict::Pass;
    if (g.state != MatrixGateResult::State::Skipped) continue;
    skipped += (skipped.empty() ? "" : ", ") + matrix_model_name(spec.models[g.model]);
    why = g.why;
  }
  std::string note;
  if (all_passed) note = " The token gate passed on every model.";
  if (!skipped.empty())
    note += " **Token gate not run here:** " + skipped + " — SKIP (" + why +
            "); a skipped gate is never counted as passed.";
  // A localized defect is a gate defect the finding already names; an unexplained one is a
  // defect too, but one that no stage's bound accounts for, which the answer says apart.
  std::string unexplained;
  int n = 0;
  for (const MatrixGateResult& g : gates)
    for (const MatrixLocalized& x : g.localize)
      if (x.cls == localize_class_name(LocalizeClass::Unexplained))
        ++n, unexplained += strformat("%s%s `%s` prompt %d step %d",
                                      unexplained.empty() ? "" : "; ",
                                      matrix_model_name(spec.models[g.model]).c_str(),
                                      x.side.c_str(), x.prompt, x.step);
  if (n)
    note += strformat(" **Token gate, unexplained:** %d divergence(s) (%s) cost more than the "
                      "band with no stage over its bound; the drift does not localize them.",
                      n, unexplained.c_str());
  return note;
}

void matrix_gate_section(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates,
                         Doc& d) {
  if (!spec.has_gate) return;
  const MatrixGate& mg = spec.gate;
  std::string arms;
  for (const auto& a : mg.arms) arms += (arms.empty() ? "`" : ", `") + a + "`";
  d.heading(2, "Token gate", "gate");
  d.para(strformat(
      "Each side (%s%s) greedily decodes %d tokens after each prompt of `%s`, %d time(s). A side "
      "must agree with itself across its runs. Where a side first leaves the reference `%s`, the "
      "reference judges the step teacher-forced on the shared prefix: a **near-tie** when the "
      "side's token is within %g nats of the reference's top-1, otherwise a **defect**. A defect "
      "on a self-consistent side is a gate FAIL, which fails the matrix; a side that disagrees "
      "with itself makes the gate INCONCLUSIVE (docs/matrix.md, Token gate).",
      arms.c_str(), mg.against.empty() ? "" : " and the recorded legs of `against`", mg.n_tokens,
      mg.prompts.c_str(), mg.runs, mg.arms.front().c_str(), mg.band));
  for (const MatrixGateResult& g : gates) {
    const std::string model = matrix_model_name(spec.models[g.model]);
    d.heading(3, model, "gate-" + model);
    std::string v = verdict_name(g.verdict);
    for (char& c : v) c = char(std::toupper((unsigned char)c));
    if (g.state != MatrixGateResult::State::Done) {
      if (g.state == MatrixGateResult::State::Skipped) v = "SKIP";
      d.para("**Verdict:** " + v + (g.counted ? "" : " (not counted)") + " — " + g.why);
      continue;
    }
    const GateReport& r = g.report;
    d.para("**Verdict:** " + v + " — " + r.verdict_reason + strformat(
        ". `%s`: %d prompt(s), sha256 `%s`; tokenizers %s.", g.file.c_str(), r.n_prompts,
        r.prompts_sha256.substr(0, 16).c_str(), r.tokenizers_agree ? "agree" : "DISAGREE"));
    std::vector<std::vector<std::string>> sides = {
        {"side", "tier", "inject", "self-consistent", "diverged", "near-ties", "defects"}};
    for (size_t s = 0; s < r.sides.size(); ++s) {
      const GateSideSummary& x = r.sides[s];
      sides.push_back({"`" + x.label + "`" + (s == 0 ? " (reference)" : "") +
                           (x.recorded ? " (recorded)" : ""),
                       x.device + " " + x.compute, x.inject, x.consistent ? "yes" : "NO",
                       s == 0 ? "-" : strformat("%d/%d", x.diverged, r.n_prompts),
                       s == 0 ? "-" : std::to_string(x.near_ties),
                       s == 0 ? "-" : (x.defects ? "FAIL " : "") + std::to_string(x.defects)});
    }
    d.table(sides, "gate-sides-" + model);
    if (r.divergences.empty()) {
      d.para("No divergence: every side reproduced the reference's tokens on every prompt.");
    } else {
      std::vector<std::vector<std::string>> t = {{"side", "prompt", "step", "reference", "side's",
                                                  "ref gap", "rank", "deficit", "own gap",
                                                  "class"}};
      auto f = [](double x) { return std::isfinite(x) ? strformat("%.4f", x) : std::string("-"); };
      for (const GateDivergence& x : r.divergences) {
        std::string cls = x.j.near_tie ? "near-tie" : "FAIL defect";
        if (!x.counts)
          cls = std::string(x.j.near_tie ? "near-tie" : "defect") + " (not judged: inconsistent)";
        t.push_back({code(r.sides[size_t(x.side)].label), std::to_string(x.prompt + 1),
                     std::to_string(x.step), code(gate_token_text(r, x.j.ref_token)),
                     code(gate_token_text(r, x.j.side_token)), f(x.j.ref_gap),
                     std::to_string(x.j.side_rank), f(x.j.deficit), f(x.side_own_gap), cls});
      }
      d.para("Divergences (the first step where a side leaves the reference; *ref gap*: the "
             "reference's top-1/top-2 margin there, *deficit*: how far below its top-1 the "
             "reference puts the side's token, *own gap*: the side's own margin, nats):");
      d.table(t, "gate-divergences-" + model);
    }
    if (g.localized) localize_blocks(g, model, d);
    if (!r.inconsistencies.empty()) {
      std::vector<std::vector<std::string>> t = {
          {"side", "prompt", "run", "step", "run 0", "this run"}};
      for (const GateInconsistency& x : r.inconsistencies)
        t.push_back({code(r.sides[size_t(x.side)].label), std::to_string(x.prompt + 1),
                     std::to_string(x.run + 1), std::to_string(x.step),
                     code(gate_token_text(r, x.run0_token)),
                     code(gate_token_text(r, x.run_token))});
      d.para("**Self-consistency failures** (a run that leaves the side's own run 0):");
      d.table(t, "gate-inconsistent-" + model);
    }
    if (r.sides.size() < 3) continue;  // with two sides the divergences name the judged side
    // The resolution (gate_resolve, the rule of docs/localize.md) as a table of the report's
    // document model, so report.md and report.html show the same rows; the columns are those
    // of gate_resolution_markdown.
    const std::vector<GateResolutionRow> rows = gate_resolve(r);
    if (rows.empty()) {
      d.para("No contested step: the sides never split while on the reference's path.");
      continue;
    }
    std::vector<std::vector<std::string>> t(1, {"prompt", "step"});
    for (const GateSideSummary& s : r.sides) t[0].push_back(code(s.label));
    t[0].push_back("resolution");
    for (const GateResolutionRow& row : rows) {
      t.push_back({std::to_string(row.prompt + 1), std::to_string(row.step)});
      for (int32_t tok : row.tokens)
        t.back().push_back(tok == kGateLeftEarlier ? "(left)" : code(gate_token_text(r, tok)));
      t.back().push_back(row.text);
    }
    d.para("Resolution of the contested steps (where sides still on the reference's path split):");
    d.table(t, "gate-resolution-" + model);
  }
}

json matrix_gate_json(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates) {
  const char* states[] = {"done", "skipped", "missing", "error"};
  json a = json::array();
  for (const MatrixGateResult& g : gates) {
    json e = {{"model", matrix_model_name(spec.models[g.model])},
              {"file", g.file},
              {"state", states[int(g.state)]},
              {"verdict", verdict_name(g.verdict)},
              {"counted", g.counted}};
    if (!g.why.empty()) e["why"] = g.why;
    if (g.state == MatrixGateResult::State::Done) {
      e["gate"] = gate_json(g.report);
      if (g.report.sides.size() >= 3)
        e["resolution"] = gate_resolution_json(g.report, gate_resolve(g.report));
      if (g.localized) e["localize"] = g.localize_json;
    }
    a.push_back(e);
  }
  return a;
}

}  // namespace arbiter::verify
