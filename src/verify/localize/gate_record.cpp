// Recorded gate legs: record, read, resolve, reproduce (verify/localize/gate_record.h).
#include "verify/localize/gate_record.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/build_info.h"
#include "core/error.h"
#include "core/progress.h"
#include "engine/probe.h"
#include "engine/session.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "model/model.h"
#include "verify/trace/host_info.h"
#include "verify/trace/store.h"

namespace arbiter::verify {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifest = "manifest.json";

std::string side_file(size_t n) { return "side-" + std::to_string(n) + ".json"; }

// "d/" and "d" name one directory; the hidden temporary sits beside it.
fs::path record_path(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return fs::path(d);
}

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

void gate_record_check_target(const std::string& dir) {
  ARB_CHECK(!dir.empty(), "[gate] --record: empty directory name");
  std::error_code ec;
  const fs::path out = record_path(dir);
  if (!fs::exists(out, ec)) return;
  ARB_CHECK(fs::is_directory(out, ec), "[gate] %s: exists and is not a directory", dir.c_str());
  ARB_CHECK(fs::is_empty(out, ec) && !ec,
            "[gate] %s: exists and is not empty; a record is never written over another",
            dir.c_str());
}

void gate_record_write(const std::string& dir, const GateReport& r, const GateRecordInfo& info) {
  gate_record_check_target(dir);
  ARB_CHECK(r.tokenizers_agree, "[gate] %s: not recorded: the sides tokenize the prompts differently",
            dir.c_str());
  ARB_CHECK(r.side_runs.size() == r.sides.size(), "[gate] record: %zu side runs for %zu sides",
            r.side_runs.size(), r.sides.size());
  json m;
  m["format"] = kGateRecordFormat;
  m["version"] = kGateRecordVersion;
  m["model"] = {{"path", r.model_path}, {"weights_sha256", r.weights_sha256}};
  m["tokenizer"] = {{"sha256", r.tokenizer_sha256}};
  m["prompts"] = {{"path", r.prompts_path},
                  {"sha256", r.prompts_sha256},
                  {"count", r.n_prompts},
                  {"lines", r.prompt_lines},
                  {"ids", r.prompt_ids}};
  m["tokens"] = r.n_tokens;
  m["runs"] = r.runs;
  m["topk"] = kGateRecordTopK;
  m["build"] = {{"version", kVersion},
                {"commit", kGitCommit},
                {"compiler", build_compiler()},
                {"cuda", cuda_runtime_version()}};
  json host = json::object();
  for (const auto& [k, v] : host_header_lines()) host[k] = v;
  m["host"] = host;
  m["env"] = info.env;
  m["command"] = info.command;
  m["verdict"] = verdict_name(r.verdict);
  m["sides"] = json::array();
  std::vector<std::pair<std::string, std::string>> files;  // name, content
  for (size_t s = 0; s < r.sides.size(); ++s) {
    const GateSideSummary& g = r.sides[s];
    if (g.recorded) continue;  // already recorded where it ran; never re-recorded as if here
    const GateSideRuns& run = r.side_runs[s];
    ARB_CHECK(run.top_ids.size() == run.tokens.size(),
              "[gate] record: side %s has no top-k (run_gate without topk)", g.label.c_str());
    const std::string name = side_file(files.size() + 1);
    m["sides"].push_back({{"spec", g.label},
                          {"file", name},
                          {"device", g.device},
                          {"compute", g.compute},
                          {"inject", g.inject},
                          {"consistent", g.consistent},
                          {"providers", g.providers},
                          {"fallbacks", g.fallbacks}});
    json gaps = json::array();
    for (const auto& row : run.own_gap) {
      json a = json::array();
      for (double v : row) a.push_back(num(v));
      gaps.push_back(a);
    }
    json sj = {{"spec", g.label},
               {"tokens", run.tokens},
               {"own_gap", gaps},
               {"top_ids", run.top_ids},
               {"top_logprobs", run.top_logprobs}};
    files.emplace_back(name, sj.dump() + "\n");
  }
  ARB_CHECK(!files.empty(), "[gate] %s: no live side to record", dir.c_str());
  files.emplace_back(kManifest, m.dump(2) + "\n");

  const fs::path out = record_path(dir);
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string prefix = "." + out.filename().string() + ".record-tmp-";
  remove_dead_process_entries(parent.string(), prefix, true);  // left by killed recordings
  const fs::path tmp = parent / (prefix + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error("[gate] " + tmp.string() + ": cannot create (" + ec.message() + ")");
  try {
    for (const auto& [name, text] : files) write_file_atomic((tmp / name).string(), text, "[gate]");
    write_sha256sums(tmp.string(), "[gate]");
    // rename(2) replaces an empty directory, and nothing else: a record that appeared at dir
    // during the run is not overwritten.
    fs::rename(tmp, out, ec);
    if (ec) throw Error("[gate] " + dir + ": cannot move the record into place (" + ec.message() + ")");
  } catch (...) {
    std::error_code ec2;
    fs::remove_all(tmp, ec2);
    throw;
  }
}

// --- reading ------------------------------------------------------------------------------

namespace {

json read_json(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  const std::string text = read_input_file(path, "[gate]", kMaxInputBytes, "a gate record file");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error("[gate] " + path + ": not JSON (" + e.what() + ")");
  }
}

template <class T>
T field(const json& j, const char* key, const std::string& where) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw Error("[gate] " + where + ": field '" + key + "' missing or of the wrong type (" +
                e.what() + ")");
  }
}

// The record's content, after its checksums passed.
std::vector<GateRecordedSide> read_checked_record(const std::string& dir) {
  const std::string mpath = dir + "/" + kManifest;
  const json m = read_json(dir, kManifest);
  ARB_CHECK(m.is_object() && m.value("format", "") == kGateRecordFormat,
            "[gate] %s: not a gate record (format is not '%s')", mpath.c_str(), kGateRecordFormat);
  const int version = field<int>(m, "version", mpath);
  ARB_CHECK(version == kGateRecordVersion, "[gate] %s: record version %d, this build reads %d",
            mpath.c_str(), version, kGateRecordVersion);
  const json& prompts = m.at("prompts");
  const auto prompt_ids = field<std::vector<std::vector<int32_t>>>(prompts, "ids", mpath);
  const int n_tokens = field<int>(m, "tokens", mpath);
  const int n_runs = field<int>(m, "runs", mpath);
  ARB_CHECK(n_tokens >= 1 && n_runs >= 1, "[gate] %s: %d tokens and %d run(s); both must be >= 1",
            mpath.c_str(), n_tokens, n_runs);
  const std::string host = field<json>(m, "host", mpath).value("host", "unknown");
  ARB_CHECK(m.contains("sides") && m["sides"].is_array() && !m["sides"].empty(),
            "[gate] %s: no sides", mpath.c_str());
  std::vector<GateRecordedSide> out;
  for (const json& sd : m["sides"]) {
    GateRecordedSide rs;
    rs.source = dir;
    rs.spec = field<std::string>(sd, "spec", mpath);
    rs.weights_sha256 = field<std::string>(m.at("model"), "weights_sha256", mpath);
    rs.tokenizer_sha256 = field<std::string>(m.at("tokenizer"), "sha256", mpath);
    rs.prompts_sha256 = field<std::string>(prompts, "sha256", mpath);
    rs.n_tokens = n_tokens;
    rs.prompt_ids = prompt_ids;
    GateSideSummary& g = rs.summary;
    g.label = "rec:" + rs.spec + "@" + host;
    g.device = field<std::string>(sd, "device", mpath);
    g.compute = field<std::string>(sd, "compute", mpath);
    g.inject = field<std::string>(sd, "inject", mpath);
    g.providers = field<std::string>(sd, "providers", mpath);
    g.fallbacks = field<int64_t>(sd, "fallbacks", mpath);
    g.recorded = true;
    // A leg that silently ran on another provider is not the tier it claims (DESIGN.md §2).
    ARB_CHECK(g.fallbacks == 0,
              "[gate] %s: side %s recorded %lld op fallback(s) (providers %s); a leg that fell "
              "back to another provider is refused",
              dir.c_str(), rs.spec.c_str(), (long long)g.fallbacks, g.providers.c_str());
    const std::string file = field<std::string>(sd, "file", mpath);
    ARB_CHECK(file.find('/') == std::string::npos && file != kManifest,
              "[gate] %s: side file '%s' is not a record file", mpath.c_str(), file.c_str());
    const std::string spath = dir + "/" + file;
    const json sj = read_json(dir, file);
    rs.runs.label = g.label;
    rs.runs.tokens = field<std::vector<std::vector<std::vector<int32_t>>>>(sj, "tokens", spath);
    rs.runs.top_ids = field<std::vector<std::vector<std::vector<int32_t>>>>(sj, "top_ids", spath);
    for (const json& row : field<json>(sj, "own_gap", spath)) {
      std::vector<double> gaps;
      for (const json& v : row) gaps.push_back(v.is_number() ? v.get<double>() : NAN);
      rs.runs.own_gap.push_back(gaps);
    }
    const json& lp = field<json>(sj, "top_logprobs", spath);
    for (const json& row : lp) {
      std::vector<std::vector<double>> steps;
      for (const json& st : row) {
        std::vector<double> v;
        for (const json& x : st) v.push_back(x.is_number() ? x.get<double>() : NAN);
        steps.push_back(v);
      }
      rs.runs.top_logprobs.push_back(steps);
    }
    ARB_CHECK(rs.runs.tokens.size() == prompt_ids.size(),
              "[gate] %s: %zu prompts of tokens, the manifest has %zu prompts", spath.c_str(),
              rs.runs.tokens.size(), prompt_ids.size());
    for (size_t p = 0; p < rs.runs.tokens.size(); ++p) {
      ARB_CHECK(int(rs.runs.tokens[p].size()) == n_runs,
                "[gate] %s: prompt %zu has %zu run(s), the manifest says %d", spath.c_str(), p + 1,
                rs.runs.tokens[p].size(), n_runs);
      for (const auto& seq : rs.runs.tokens[p])
        ARB_CHECK(int(seq.size()) == n_tokens, "[gate] %s: prompt %zu: a run of %zu tokens, the "
                  "manifest says %d", spath.c_str(), p + 1, seq.size(), n_tokens);
    }
    out.push_back(std::move(rs));
  }
  return out;
}

}  // namespace

std::vector<GateRecordedSide> gate_record_read(const std::string& dir) {
  std::error_code ec;
  ARB_CHECK(fs::is_directory(dir, ec), "[gate] %s: not a directory (expected a gate record)",
            dir.c_str());
  // Checksums first: nothing of a tampered record is believed, not even its manifest.
  const std::vector<std::string> problems = check_sha256sums(dir);
  ARB_CHECK(problems.empty(), "[gate] %s: checksum check failed: %s%s", dir.c_str(),
            problems[0].c_str(),
            problems.size() > 1 ? (" (and " + std::to_string(problems.size() - 1) + " more)").c_str()
                                : "");
  // Field checks name the field; a JSON value of an unexpected shape deeper down lands here.
  try {
    return read_checked_record(dir);
  } catch (const json::exception& e) {
    throw Error("[gate] " + dir + ": not a gate record (" + e.what() + ")");
  }
}

// --- resolution ---------------------------------------------------------------------------

namespace {

std::string names_of(const GateReport& r, const std::vector<int>& sides) {
  std::string o;
  for (size_t k = 0; k < sides.size(); ++k)
    o += (k ? (k + 1 == sides.size() ? " and " : ", ") : "") + r.sides[size_t(sides[k])].label;
  return o;
}

}  // namespace

std::vector<GateResolutionRow> gate_resolve(const GateReport& r) {
  const int nS = int(r.sides.size());
  // The step at which each (side, prompt) first disagreed with itself.
  std::map<std::pair<int, int>, int> unsteady;
  for (const GateInconsistency& in : r.inconsistencies) unsteady[{in.side, in.prompt}] = in.step;
  auto is_oracle = [&](int s) { return r.sides[size_t(s)].recorded && r.sides[size_t(s)].device == "ref"; };

  std::vector<GateResolutionRow> rows;
  for (const GateContested& c : r.contested) {
    GateResolutionRow row;
    row.prompt = c.prompt;
    row.step = c.step;
    row.tokens.assign(size_t(nS), kGateLeftEarlier);
    // Settled sides vote; a side that changed its own token across runs by now does not.
    std::vector<int> unsettled;
    std::vector<std::pair<int32_t, std::vector<int>>> groups;  // token -> settled sides
    for (size_t g = 0; g < c.groups.size(); ++g)
      for (int s : c.groups[g]) {
        row.tokens[size_t(s)] = c.tokens[g];
        auto it = unsteady.find({s, c.prompt});
        if (it != unsteady.end() && it->second <= c.step) {
          unsettled.push_back(s);
          continue;
        }
        if (groups.empty() || groups.back().first != c.tokens[g]) groups.push_back({c.tokens[g], {}});
        groups.back().second.push_back(s);
      }
    int settled = 0;
    bool all_live = true;
    for (const auto& g : groups)
      for (int s : g.second) ++settled, all_live = all_live && !r.sides[size_t(s)].recorded;
    const std::string unsettled_text =
        unsettled.empty() ? ""
                          : names_of(r, unsettled) +
                                (unsettled.size() > 1 ? " disagree with themselves"
                                                      : " disagrees with itself");
    if (!unsettled.empty() && groups.size() <= 1) {
      row.kind = "self-inconsistent";
      row.named = unsettled;
      row.text = (groups.empty() ? std::string("no side is settled")
                                 : (all_live ? "our tiers agree" : names_of(r, groups[0].second) + " agree")) +
                 "; " + unsettled_text;
      rows.push_back(row);
      continue;
    }
    // wrong: exactly one settled side alone, all the others (two or more) on one token.
    if (groups.size() == 2 && settled >= 3 &&
        (groups[0].second.size() == 1 || groups[1].second.size() == 1)) {
      const auto& alone = groups[0].second.size() == 1 ? groups[0] : groups[1];
      const auto& rest = groups[0].second.size() == 1 ? groups[1] : groups[0];
      row.kind = "wrong";
      row.named = alone.second;
      row.text = "side " + names_of(r, alone.second) + " wrong (alone against " +
                 names_of(r, rest.second) + ", which agree)";
    } else {
      // right: the one group holding the recorded oracle has a live side, and another live
      // side is elsewhere.
      int oracle_group = -1, n_oracle_groups = 0;
      for (size_t g = 0; g < groups.size(); ++g)
        if (std::any_of(groups[g].second.begin(), groups[g].second.end(), is_oracle))
          oracle_group = int(g), ++n_oracle_groups;
      std::vector<int> right, other_live, oracles;
      if (n_oracle_groups == 1)
        for (size_t g = 0; g < groups.size(); ++g)
          for (int s : groups[g].second) {
            if (int(g) == oracle_group && is_oracle(s)) oracles.push_back(s);
            if (r.sides[size_t(s)].recorded) continue;
            (int(g) == oracle_group ? right : other_live).push_back(s);
          }
      if (!right.empty() && !other_live.empty()) {
        row.kind = "right";
        row.named = right;
        row.text = "side " + names_of(r, right) + " right (agrees with the recorded oracle " +
                   names_of(r, oracles) + "; " + names_of(r, other_live) +
                   (other_live.size() > 1 ? " do not)" : " does not)");
      } else {
        row.kind = "split";
        std::string parts;
        for (const auto& g : groups)
          parts += (parts.empty() ? "" : " / ") + names_of(r, g.second);
        row.text = "split (" + parts + ")";
      }
    }
    if (!unsettled.empty()) row.text += "; " + unsettled_text;
    rows.push_back(row);
  }
  return rows;
}

namespace {

std::string cell(const GateReport& r, int32_t t) {
  return t == kGateLeftEarlier ? "(left)" : gate_token_text(r, t);
}

}  // namespace

std::string gate_resolution_text(const GateReport& r, const std::vector<GateResolutionRow>& rows) {
  std::string o = "\nresolution (contested steps; rule in docs/localize.md):\n";
  if (r.sides.size() < 3) return o + "  needs three sides or more\n";
  if (rows.empty()) return o + "  none\n";
  std::vector<size_t> w(r.sides.size());
  for (size_t s = 0; s < r.sides.size(); ++s) {
    w[s] = r.sides[s].label.size();
    for (const GateResolutionRow& row : rows) w[s] = std::max(w[s], cell(r, row.tokens[s]).size());
  }
  auto pad = [](std::string s, size_t n) { return s + std::string(n > s.size() ? n - s.size() : 0, ' '); };
  o += "  prompt  step  ";
  for (size_t s = 0; s < r.sides.size(); ++s) o += pad(r.sides[s].label, w[s]) + "  ";
  o += "resolution\n";
  for (const GateResolutionRow& row : rows) {
    char b[32];
    std::snprintf(b, sizeof b, "  %6d  %4d  ", row.prompt + 1, row.step);
    o += b;
    for (size_t s = 0; s < r.sides.size(); ++s) o += pad(cell(r, row.tokens[s]), w[s]) + "  ";
    o += row.text + "\n";
  }
  return o;
}

std::string gate_resolution_markdown(const GateReport& r,
                                     const std::vector<GateResolutionRow>& rows) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
    return o;
  };
  std::string o = "| prompt | step |";
  for (const GateSideSummary& g : r.sides) o.append(" ").append(esc(g.label)).append(" |");
  o += " resolution |\n|---:|---:|";
  for (size_t s = 0; s < r.sides.size(); ++s) o += "---|";
  o += "---|\n";
  for (const GateResolutionRow& row : rows) {
    o.append("| ").append(std::to_string(row.prompt + 1)).append(" | ");
    o.append(std::to_string(row.step)).append(" |");
    for (int32_t t : row.tokens) o.append(" `").append(esc(cell(r, t))).append("` |");
    o.append(" ").append(esc(row.text)).append(" |\n");
  }
  return o;
}

json gate_resolution_json(const GateReport& r, const std::vector<GateResolutionRow>& rows) {
  json a = json::array();
  for (const GateResolutionRow& row : rows) {
    json tokens = json::object(), named = json::array();
    for (size_t s = 0; s < r.sides.size(); ++s)
      tokens[r.sides[s].label] = row.tokens[s] == kGateLeftEarlier ? json(nullptr) : json(row.tokens[s]);
    for (int s : row.named) named.push_back(r.sides[size_t(s)].label);
    a.push_back({{"prompt", row.prompt + 1},
                 {"step", row.step},
                 {"tokens", tokens},
                 {"class", row.kind},
                 {"sides", named},
                 {"text", row.text}});
  }
  return a;
}

// --- reproduction -------------------------------------------------------------------------

std::vector<GateReproduction> gate_reproduce(GateReport& r,
                                             const std::vector<GateRecordedSide>& recorded,
                                             int threads,
                                             bool progress) {
  std::vector<GateReproduction> out;
  std::unique_ptr<Model> model;
  for (const GateRecordedSide& rs : recorded) {
    GateReproduction rep;
    rep.label = rs.summary.label;
    std::unique_ptr<Backend> be;
    Side side;
    try {
      side = parse_side(rs.spec);
      be = make_side_backend(side, threads);
    } catch (const Error& e) {
      rep.why_not = std::string("its tier is not available here (") + e.what() + ")";
      out.push_back(rep);
      continue;
    }
    rep.device = be->device_name();
    rep.compute = dtype_name(be->compute());
    if (rep.compute != rs.summary.compute) {
      rep.why_not = "recorded in " + rs.summary.compute + ", " + rs.spec + " computes in " +
                    rep.compute + " here";
      out.push_back(rep);
      continue;
    }
    if (!model) model = load_model(r.model_path);
    const auto& rec = rs.runs.tokens;
    const int runs = int(rec[0].size());
    size_t max_prompt = 0;
    for (const auto& v : r.prompt_ids) max_prompt = std::max(max_prompt, v.size());
    Session ses(*model, *be, int(max_prompt) + rs.n_tokens);
    ses.set_inject(side.inject);
    const GateSideRuns here =
        gate_decode(ses, r.prompt_ids, rs.n_tokens, runs, 0, [&](int p, int k) {
          if (progress)
            progress_note("gate", "reproducing " + rep.label + ": prompt " + std::to_string(p + 1) + ", run " +
                     std::to_string(k + 1));
        });
    rep.attempted = true;
    rep.exact = true;
    for (size_t p = 0; p < rec.size() && rep.exact; ++p)
      for (size_t k = 0; k < rec[p].size() && rep.exact; ++k)
        for (size_t i = 0; i < rec[p][k].size(); ++i) {
          ++rep.steps;
          if (rec[p][k][i] == here.tokens[p][k][i]) continue;
          rep.exact = false;
          rep.prompt = int(p), rep.run = int(k), rep.step = int(i);
          rep.recorded_token = rec[p][k][i];
          rep.here_token = here.tokens[p][k][i];
          for (int32_t t : {rep.recorded_token, rep.here_token})
            if (t >= 0 && t < model->config.vocab) r.pieces[t] = model->tokenizer->token_bytes(t);
          break;
        }
    out.push_back(rep);
  }
  return out;
}

std::string gate_reproduction_text(const GateReport& r, const std::vector<GateReproduction>& rep) {
  std::string o = "\nreproduction (recorded sides rerun here, token by token):\n";
  if (rep.empty()) o += "  no recorded side\n";
  for (const GateReproduction& x : rep) {
    if (!x.attempted) {
      o += "  " + x.label + ": not reproduced: " + x.why_not + "\n";
    } else if (x.exact) {
      o += "  " + x.label + ": reproduced on " + x.device + " (" + x.compute + "): all " +
           std::to_string(x.steps) + " steps reproduced\n";
    } else {
      const int line = x.prompt < int(r.prompt_lines.size()) ? r.prompt_lines[size_t(x.prompt)] : 0;
      o += "  " + x.label + ": NOT REPRODUCED on " + x.device + " (" + x.compute +
           "): first difference at prompt " + std::to_string(x.prompt + 1) + " (line " +
           std::to_string(line) + "), run " + std::to_string(x.run + 1) + ", step " +
           std::to_string(x.step) + ": recorded " + gate_token_text(r, x.recorded_token) +
           ", here " + gate_token_text(r, x.here_token) + "\n";
    }
  }
  return o;
}

json gate_reproduction_json(const std::vector<GateReproduction>& rep) {
  json a = json::array();
  for (const GateReproduction& x : rep) {
    json e = {{"side", x.label}, {"attempted", x.attempted}};
    if (!x.attempted) {
      e["why_not"] = x.why_not;
    } else {
      e["device"] = x.device;
      e["compute"] = x.compute;
      e["exact"] = x.exact;
      e["steps_compared"] = x.steps;
      if (!x.exact)
        e["first_difference"] = {{"prompt", x.prompt + 1},
                                 {"run", x.run + 1},
                                 {"step", x.step},
                                 {"recorded_token", x.recorded_token},
                                 {"here_token", x.here_token}};
    }
    a.push_back(e);
  }
  return a;
}

}  // namespace arbiter::verify
