#include "verify/localize/gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/progress.h"
#include "core/text_table.h"
#include "engine/session.h"
#include "io/file.h"
#include "io/sha256.h"
#include "verify/localize/drift.h"

namespace arbiter::verify {

StepJudgement judge_step(const std::vector<double>& l, int32_t ref_token, int32_t side_token,
                         double band) {
  const int V = int(l.size());
  ARB_CHECK(V >= 1, "[gate] empty logits row");
  ARB_CHECK(ref_token >= 0 && ref_token < V && side_token >= 0 && side_token < V,
            "[gate] token ids %d, %d outside the vocabulary [0, %d)", ref_token, side_token, V);
  StepJudgement j;
  j.ref_token = ref_token;
  j.side_token = side_token;
  // top-1 and top-2, ties to the lower id (the greedy rule every tier uses)
  int32_t t1 = -1, t2 = -1;
  for (int v = 0; v < V; ++v) {
    if (std::isnan(l[v])) continue;
    if (t1 < 0 || l[v] > l[t1])
      t2 = t1, t1 = v;
    else if (t2 < 0 || l[v] > l[t2])
      t2 = v;
  }
  ARB_CHECK(t1 >= 0 && std::isfinite(l[t1]) && std::isfinite(l[side_token]),
            "[gate] non-finite reference logits at the compared tokens");
  j.ref_top1 = t1;
  j.ref_top2 = t2;
  j.ref_gap = t2 >= 0 ? l[t1] - l[t2] : INFINITY;
  double sum = 0;
  for (int v = 0; v < V; ++v)
    if (std::isfinite(l[v])) sum += std::exp(l[v] - l[t1]);
  const double lse = l[t1] + std::log(sum);
  int rank = 1;
  for (int v = 0; v < V; ++v)
    if (l[v] > l[side_token] || (l[v] == l[side_token] && v < side_token)) ++rank;
  j.side_rank = rank;
  j.deficit = l[t1] - l[side_token];  // logprob difference = logit difference
  j.side_logprob = l[side_token] - lse;
  j.near_tie = j.deficit <= band;
  return j;
}

namespace {

// Every run of a side against its run 0; the first disagreeing run per (side, prompt).
void check_self_consistency(const std::vector<GateSideRuns>& sides, GateReport& r) {
  for (size_t s = 0; s < sides.size(); ++s)
    for (size_t p = 0; p < sides[s].tokens.size(); ++p) {
      const auto& runs = sides[s].tokens[p];
      for (size_t k = 1; k < runs.size(); ++k) {
        const auto &a = runs[0], &b = runs[k];
        if (a == b) continue;
        size_t i = 0;
        while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
        r.inconsistencies.push_back({int(s), int(p), int(k), int(i), i < a.size() ? a[i] : -1,
                                     i < b.size() ? b[i] : -1});
        r.sides[s].consistent = false;
        break;  // the first disagreeing run per (side, prompt) is enough to report
      }
    }
}

}  // namespace

void gate_analyze(const std::vector<GateSideRuns>& sides, const TeacherForcedFn& ref_logits,
                  double band, GateReport& r) {
  const int nS = int(sides.size());
  ARB_CHECK(nS >= 2, "[gate] need at least two sides (a reference and a candidate), got %d", nS);
  ARB_CHECK(int(r.sides.size()) == nS, "[gate] %zu side summaries for %d sides", r.sides.size(),
            nS);
  const int P = int(sides[0].tokens.size());
  for (const GateSideRuns& s : sides) {
    ARB_CHECK(int(s.tokens.size()) == P, "[gate] side %s: %zu prompts, reference has %d",
              s.label.c_str(), s.tokens.size(), P);
    for (const auto& runs : s.tokens)
      ARB_CHECK(!runs.empty(), "[gate] side %s: a prompt without runs", s.label.c_str());
  }
  r.band = band;
  r.inconsistencies.clear();
  r.divergences.clear();
  r.contested.clear();
  for (GateSideSummary& s : r.sides) s.consistent = true, s.diverged = s.near_ties = s.defects = 0;

  // 1. Self-consistency: every run of a side against its run 0.
  check_self_consistency(sides, r);
  const bool ref_ok = r.sides[0].consistent;

  // 2. First divergence of each side from the reference, judged by the reference.
  std::map<std::pair<int, int>, std::vector<double>> cache;
  auto logits_at = [&](int p, int step) -> const std::vector<double>& {
    auto key = std::make_pair(p, step);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, ref_logits(0, p, step)).first;
    return it->second;
  };
  for (int s = 1; s < nS; ++s)
    for (int p = 0; p < P; ++p) {
      const auto& ref = sides[0].tokens[size_t(p)][0];
      const auto& seq = sides[size_t(s)].tokens[size_t(p)][0];
      size_t i = 0;
      while (i < ref.size() && i < seq.size() && ref[i] == seq[i]) ++i;
      if (i >= ref.size() || i >= seq.size()) continue;  // no token-level divergence
      GateDivergence d;
      d.side = s;
      d.prompt = p;
      d.step = int(i);
      d.j = judge_step(logits_at(p, int(i)), ref[i], seq[i], band);
      const auto& og = sides[size_t(s)].own_gap;
      if (size_t(p) < og.size() && i < og[size_t(p)].size()) d.side_own_gap = og[size_t(p)][i];
      d.counts = ref_ok && r.sides[size_t(s)].consistent;
      GateSideSummary& sum = r.sides[size_t(s)];
      ++sum.diverged;
      if (d.j.near_tie)
        ++sum.near_ties;
      else
        ++sum.defects;
      r.divergences.push_back(d);
    }

  // 3. Contested steps (three or more sides): group the sides still on the reference's path.
  if (nS >= 3)
    for (int p = 0; p < P; ++p) {
      std::vector<int> active(static_cast<size_t>(nS), 0);
      for (int s = 0; s < nS; ++s) active[size_t(s)] = s;
      const auto& ref = sides[0].tokens[size_t(p)][0];
      for (size_t i = 0; i < ref.size() && active.size() > 1; ++i) {
        GateContested c;
        c.prompt = p;
        c.step = int(i);
        for (int s : active) {
          const auto& seq = sides[size_t(s)].tokens[size_t(p)][0];
          int32_t t = i < seq.size() ? seq[i] : -1;
          auto it = std::find(c.tokens.begin(), c.tokens.end(), t);
          if (it == c.tokens.end()) {
            c.tokens.push_back(t);
            c.groups.push_back({s});
          } else {
            c.groups[size_t(it - c.tokens.begin())].push_back(s);
          }
        }
        if (c.groups.size() == 1) continue;
        for (int s = 0; s < nS; ++s)
          if (std::find(active.begin(), active.end(), s) == active.end())
            c.left_earlier.push_back(s);
        active = c.groups[0];  // group 0 holds side 0, the reference
        r.contested.push_back(c);
      }
    }

  // 4. Verdict.
  int defects = 0, near = 0, uncounted = 0;
  for (const GateDivergence& d : r.divergences) {
    if (!d.counts)
      ++uncounted;
    else if (d.j.near_tie)
      ++near;
    else
      ++defects;
  }
  int inconsistent = 0;
  std::string who;
  for (const GateSideSummary& s : r.sides)
    if (!s.consistent) ++inconsistent, who += (who.empty() ? "" : ", ") + s.label;
  char b[256];
  if (!r.tokenizers_agree) {
    r.verdict = Verdict::Incomparable;
    r.verdict_reason = "the sides tokenize the prompts differently";
  } else if (defects > 0) {
    r.verdict = Verdict::Fail;
    std::snprintf(b, sizeof b,
                  "%d defect(s): a side chose a token more than %g nats below the "
                  "reference's top-1",
                  defects, band);
    r.verdict_reason = b;
  } else if (inconsistent > 0) {
    r.verdict = Verdict::Inconclusive;
    std::snprintf(b, sizeof b, "%d side(s) disagree with themselves across runs (%s)%s",
                  inconsistent, who.c_str(),
                  uncounted ? "; their divergences are reported but not judged" : "");
    r.verdict_reason = b;
  } else {
    r.verdict = Verdict::Pass;
    std::snprintf(b, sizeof b, "no defect; %d near-tie divergence(s) within %g nats", near, band);
    r.verdict_reason = b;
  }
}

// --- running it ---------------------------------------------------------------------------

namespace {

struct PromptFile {
  std::string sha256;
  std::vector<std::string> text;
  std::vector<int> line;
};

PromptFile read_prompts(const std::string& path) {
  const std::string bytes = read_input_file(path, "[gate]", kMaxInputBytes, "a prompt file");
  PromptFile pf;
  pf.sha256 = sha256_hex(bytes.data(), bytes.size());
  std::istringstream in(bytes);
  int n = 0;
  for (std::string l; std::getline(in, l);) {
    ++n;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.find_first_not_of(" \t") == std::string::npos) continue;
    pf.text.push_back(l);
    pf.line.push_back(n);
  }
  ARB_CHECK(!pf.text.empty(), "[gate] %s: no prompts (expected one prompt per line)", path.c_str());
  return pf;
}

std::string show_ids(const std::vector<int32_t>& v) {
  std::string o;
  for (size_t i = 0; i < v.size() && i < 12; ++i) o += (i ? " " : "") + std::to_string(v[i]);
  if (v.size() > 12) o += " ...";
  return o;
}

}  // namespace

GateSideRuns gate_decode(Session& ses, const std::vector<std::vector<int32_t>>& ids, int n_tokens,
                         int runs, int topk, const std::function<void(int p, int k)>& progress) {
  const int V = ses.model().config.vocab;
  const int K = std::min(std::max(2, topk), V);
  GateSideRuns out;
  out.tokens.resize(ids.size());
  out.own_gap.resize(ids.size());
  if (topk > 0) out.top_ids.resize(ids.size()), out.top_logprobs.resize(ids.size());
  for (size_t p = 0; p < ids.size(); ++p) {
    for (int k = 0; k < runs; ++k) {
      if (progress) progress(int(p), k);
      std::vector<int32_t> seq;
      std::vector<double> gaps;
      ses.reset();
      ses.prefill(ids[p]);
      for (int i = 0; i < n_tokens; ++i) {
        std::vector<int32_t> no_targets(size_t(ses.last_T()), -1);
        const LogitsSummary sm = ses.summarize(K, no_targets)[size_t(ses.last_T() - 1)];
        seq.push_back(sm.top_ids[0]);
        gaps.push_back(sm.top_logits.size() > 1 ? sm.top_logits[0] - sm.top_logits[1] : NAN);
        if (topk > 0 && k == 0) {
          const size_t n = std::min(size_t(topk), sm.top_ids.size());
          out.top_ids[p].emplace_back(sm.top_ids.begin(), sm.top_ids.begin() + long(n));
          std::vector<double> lp;
          for (size_t t = 0; t < n; ++t) lp.push_back(sm.top_logits[t] - sm.lse);
          out.top_logprobs[p].push_back(lp);
        }
        if (i + 1 < n_tokens) ses.forward({seq.back()});
      }
      out.tokens[p].push_back(seq);
      if (k == 0) out.own_gap[p] = gaps;
    }
  }
  return out;
}

std::vector<int32_t> gate_prompt_ids(const Model& m, const std::string& text) {
  return m.tokenizer->encode(text, true, false);
}

GateReport run_gate(const GateOptions& opt) {
  const size_t n_live = opt.sides.size(), n_all = n_live + opt.recorded.size();
  ARB_CHECK(n_live >= 1, "[gate] --sides names no side");
  ARB_CHECK(n_all >= 2 || (opt.single_side && n_all == 1),
            "[gate] --sides needs at least two sides (got %zu)", n_all);
  ARB_CHECK(opt.n_tokens >= 1, "[gate] -n %d must be >= 1", opt.n_tokens);
  ARB_CHECK(opt.runs >= 1, "[gate] --runs %d must be >= 1", opt.runs);
  ARB_CHECK(opt.band >= 0 && std::isfinite(opt.band), "[gate] --band %g must be >= 0", opt.band);
  auto say = [&](const std::string& s) {
    if (opt.progress) progress_note("gate", s);
  };
  GateReport r;
  r.model_path = opt.model_path;
  r.prompts_path = opt.prompts_path;
  r.n_tokens = opt.n_tokens;
  r.runs = opt.runs;
  r.band = opt.band;
  PromptFile pf = read_prompts(opt.prompts_path);
  r.prompts_sha256 = pf.sha256;
  r.n_prompts = int(pf.text.size());
  r.prompt_lines = pf.line;
  r.prompt_text = pf.text;
  for (const GateRecordedSide& rs : opt.recorded) {
    ARB_CHECK(rs.prompts_sha256 == pf.sha256,
              "[gate] %s: recorded on prompts sha256 %s, %s has sha256 %s", rs.source.c_str(),
              rs.prompts_sha256.c_str(), opt.prompts_path.c_str(), pf.sha256.c_str());
    ARB_CHECK(rs.n_tokens == opt.n_tokens, "[gate] %s: recorded %d tokens per prompt, -n is %d",
              rs.source.c_str(), rs.n_tokens, opt.n_tokens);
  }

  // One model load per side: each side tokenizes with its own tokenizer instance.
  const size_t nS = opt.sides.size();
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::vector<std::vector<int32_t>>> ids(nS);  // [side][prompt]
  for (size_t s = 0; s < nS; ++s) {
    models.push_back(load_model(opt.model_path));
    backends.push_back(make_side_backend(opt.sides[s], opt.threads));
    for (const std::string& t : pf.text) {
      ids[s].push_back(gate_prompt_ids(*models[s], t));
      ARB_CHECK(!ids[s].back().empty(), "[gate] %s: a prompt encodes to no tokens",
                opt.prompts_path.c_str());
    }
    GateSideSummary sum;
    sum.label = opt.sides[s].label;
    sum.device = backends[s]->device_name();
    sum.compute = dtype_name(backends[s]->compute());
    sum.inject = opt.sides[s].inject.text;
    r.sides.push_back(sum);
  }
  r.prompt_ids = ids[0];
  r.weights_sha256 = models[0]->weights_sha256;
  r.tokenizer_sha256 = models[0]->tokenizer->sha256();
  for (const GateRecordedSide& rs : opt.recorded) {
    ARB_CHECK(rs.weights_sha256 == r.weights_sha256,
              "[gate] %s: recorded with weights sha256 %s, %s has %s", rs.source.c_str(),
              rs.weights_sha256.c_str(), opt.model_path.c_str(), r.weights_sha256.c_str());
    ARB_CHECK(rs.tokenizer_sha256 == r.tokenizer_sha256,
              "[gate] %s: recorded with tokenizer sha256 %s, %s has %s", rs.source.c_str(),
              rs.tokenizer_sha256.c_str(), opt.model_path.c_str(), r.tokenizer_sha256.c_str());
    for (size_t p = 0; p < ids[0].size(); ++p)
      ARB_CHECK(p < rs.prompt_ids.size() && rs.prompt_ids[p] == ids[0][p],
                "[gate] %s: the prompt at line %d was recorded as tokens [%s], here [%s]",
                rs.source.c_str(), pf.line[p],
                p < rs.prompt_ids.size() ? show_ids(rs.prompt_ids[p]).c_str() : "",
                show_ids(ids[0][p]).c_str());
    ARB_CHECK(rs.prompt_ids.size() == ids[0].size(), "[gate] %s: %zu prompts recorded, %s has %zu",
              rs.source.c_str(), rs.prompt_ids.size(), opt.prompts_path.c_str(), ids[0].size());
  }
  {
    std::string note;
    for (size_t s = 1; s < nS && r.tokenizers_agree; ++s) {
      if (models[s]->tokenizer->sha256() != models[0]->tokenizer->sha256()) {
        r.tokenizers_agree = false;
        note = "side " + r.sides[s].label + " has tokenizer sha256 " +
               models[s]->tokenizer->sha256() + ", reference " + models[0]->tokenizer->sha256();
      }
      for (size_t p = 0; p < pf.text.size() && r.tokenizers_agree; ++p)
        if (ids[s][p] != ids[0][p]) {
          r.tokenizers_agree = false;
          note = "prompt at line " + std::to_string(pf.line[p]) + ": side " + r.sides[s].label +
                 " gives [" + show_ids(ids[s][p]) + "], reference [" + show_ids(ids[0][p]) + "]";
        }
    }
    if (r.tokenizers_agree)
      note = models[0]->tokenizer->kind() + " sha256 " + models[0]->tokenizer->sha256() +
             (n_all == 1 ? std::string("; one side")
                         : "; every prompt tokenized identically on all " +
                               std::to_string(n_all) + " sides");
    r.tokenizer_note = note;
  }

  size_t max_prompt = 0;
  for (const auto& v : ids[0]) max_prompt = std::max(max_prompt, v.size());
  const int ctx = int(max_prompt) + opt.n_tokens;
  const int V = models[0]->config.vocab;
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<GateSideRuns> runs(nS);
  for (size_t s = 0; s < nS; ++s) {
    ARB_CHECK(ctx <= models[s]->config.max_pos || models[s]->config.max_pos <= 0,
              "[gate] longest prompt (%zu tokens) + %d tokens exceed the model's context (%d)",
              max_prompt, opt.n_tokens, models[s]->config.max_pos);
    sessions.push_back(std::make_unique<Session>(*models[s], *backends[s], ctx));
    Session& ses = *sessions.back();
    ses.set_inject(opt.sides[s].inject);
    runs[s].label = opt.sides[s].label;
    runs[s].tokens.resize(pf.text.size());
    runs[s].own_gap.resize(pf.text.size());
    if (!r.tokenizers_agree) continue;
    Backend& be = *backends[s];
    be.stats().reset();
    runs[s] = gate_decode(ses, ids[s], opt.n_tokens, opt.runs, opt.topk, [&](int p, int k) {
      say("side " + opt.sides[s].label + ": prompt " + std::to_string(p + 1) + "/" +
          std::to_string(pf.text.size()) + ", run " + std::to_string(k + 1) + "/" +
          std::to_string(opt.runs));
    });
    runs[s].label = opt.sides[s].label;
    be.sync();
    r.sides[s].providers = be.stats().summary();
    r.sides[s].fallbacks = be.stats().fallbacks();
  }
  if (!r.tokenizers_agree) {
    // Nothing to compare token by token; report the disagreement alone.
    for (auto& rs : runs)
      for (auto& t : rs.tokens) t.push_back({});
  }
  // Recorded sides follow the live ones (their tokenization was checked above).
  for (const GateRecordedSide& rs : opt.recorded) {
    for (const auto& prompt_runs : rs.runs.tokens)
      for (const auto& seq : prompt_runs)
        for (int32_t t : seq)
          ARB_CHECK(t >= 0 && t < V, "[gate] %s: side %s holds token %d outside the vocabulary [0, %d)",
                    rs.source.c_str(), rs.summary.label.c_str(), t, V);
    runs.push_back(rs.runs);
    r.sides.push_back(rs.summary);
  }

  TeacherForcedFn tf = [&](int side, int p, int step) {
    say("teacher-forcing side " + opt.sides[size_t(side)].label + " on prompt " +
        std::to_string(p + 1) + " + " + std::to_string(step) + " tokens");
    Session& ses = *sessions[size_t(side)];
    std::vector<int32_t> in = ids[size_t(side)][size_t(p)];
    const auto& ref = runs[0].tokens[size_t(p)][0];
    in.insert(in.end(), ref.begin(), ref.begin() + step);
    ses.reset();
    ses.prefill(in);
    return ses.logits(ses.last_T() - 1);
  };
  if (runs.size() == 1) {
    // One side alone (a recording): nothing to compare it with here, only itself.
    check_self_consistency(runs, r);
    r.verdict = r.sides[0].consistent ? Verdict::Pass : Verdict::Inconclusive;
    r.verdict_reason = r.sides[0].consistent
                           ? "one side, self-consistent over " + std::to_string(opt.runs) + " run(s)"
                           : "one side, and it disagrees with itself across runs";
  } else {
    gate_analyze(runs, tf, opt.band, r);
  }

  auto piece = [&](int32_t id) {
    if (id >= 0 && id < V && !r.pieces.count(id))
      r.pieces[id] = models[0]->tokenizer->token_bytes(id);
  };
  for (const GateDivergence& d : r.divergences) {
    piece(d.j.ref_token), piece(d.j.side_token), piece(d.j.ref_top1), piece(d.j.ref_top2);
  }
  for (const GateContested& c : r.contested)
    for (int32_t t : c.tokens) piece(t);
  for (const GateInconsistency& in : r.inconsistencies) piece(in.run0_token), piece(in.run_token);
  r.side_runs = std::move(runs);
  return r;
}

// --- reports ------------------------------------------------------------------------------

std::string printable_piece(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n')
      o += "\\n";
    else if (c == '\t')
      o += "\\t";
    else if (c == '\'')
      o += "\\'";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o;
}

static std::string tok(const GateReport& r, int32_t id) {
  if (id < 0) return "(end)";
  auto it = r.pieces.find(id);
  if (it == r.pieces.end()) return std::to_string(id);
  return "'" + printable_piece(it->second) + "'(" + std::to_string(id) + ")";
}

std::string gate_token_text(const GateReport& r, int32_t id) { return tok(r, id); }

std::string gate_text(const GateReport& r) {
  // strformat and TextTable, not fixed buffers: a long model path or prompt used to cut lines.
  std::string o = strformat(
      "gate: model %s\nprompts: %s sha256 %s (%d prompts), %d tokens, %d run(s) per side, band %g nats\n"
      "tokenizer: %s%s\n\nsides:\n",
      r.model_path.c_str(), r.prompts_path.c_str(), r.prompts_sha256.c_str(), r.n_prompts, r.n_tokens, r.runs, r.band,
      r.tokenizers_agree ? "agree: " : "DISAGREE: ", r.tokenizer_note.c_str());
  int lw = 4;  // label column width
  for (const GateSideSummary& g : r.sides) lw = std::max(lw, int(g.label.size()));
  for (size_t s = 0; s < r.sides.size(); ++s) {
    const GateSideSummary& g = r.sides[s];
    std::string state = g.consistent ? "self-consistent over " + std::to_string(r.runs) + " run(s)"
                                     : "SELF-INCONSISTENT";
    std::string div = s == 0 ? "reference"
                             : std::to_string(g.diverged) + "/" + std::to_string(r.n_prompts) +
                                   " prompts diverge (" + std::to_string(g.near_ties) +
                                   " near-tie, " + std::to_string(g.defects) + " defect)";
    o += strformat("  [%zu] %-*s  %s (%s, inject %s): %s; %s\n", s, lw, g.label.c_str(), g.device.c_str(),
                   g.compute.c_str(), g.inject.c_str(), state.c_str(), div.c_str());
  }
  if (!r.inconsistencies.empty()) {
    o += "\nself-consistency failures (run k vs run 0 of the same side):\n";
    for (const GateInconsistency& in : r.inconsistencies) {
      o += strformat("  side %s, prompt %d (line %d): run %d leaves run 0 at step %d: %s vs %s\n",
                     r.sides[size_t(in.side)].label.c_str(), in.prompt + 1,
                     in.prompt < int(r.prompt_lines.size()) ? r.prompt_lines[size_t(in.prompt)] : 0, in.run + 1,
                     in.step, tok(r, in.run_token).c_str(), tok(r, in.run0_token).c_str());
    }
  }
  o += "\ndivergences (first step where a side leaves the reference; judged by the reference "
       "teacher-forced on the shared prefix):\n";
  if (r.divergences.empty()) {
    o += "  none: every side reproduced the reference's tokens on every prompt\n";
  } else {
    TextTable t({{"side", TextTable::Left},
                 {"prompt"},
                 {"step"},
                 {"reference", TextTable::Left},
                 {"side", TextTable::Left},
                 {"ref_gap"},
                 {"rank"},
                 {"deficit"},
                 {"own_gap"},
                 {"class", TextTable::Left}});
    for (size_t c : {3, 9}) t.separator_before(c, "  ");
    for (const GateDivergence& d : r.divergences) {
      std::string cls = d.j.near_tie ? "near-tie" : "DEFECT";
      if (!d.counts) cls += " (not judged: inconsistent)";
      if (d.j.ref_top1 != d.j.ref_token) cls += " [ref top-1 here is " + tok(r, d.j.ref_top1) + "]";
      t.row({r.sides[size_t(d.side)].label, std::to_string(d.prompt + 1), std::to_string(d.step),
             tok(r, d.j.ref_token), tok(r, d.j.side_token), fmt_num("%.4f", d.j.ref_gap),
             std::to_string(d.j.side_rank), fmt_num("%.4f", d.j.deficit), fmt_g(d.side_own_gap), cls});
    }
    o += t.str("  ");
  }
  if (r.sides.size() >= 3) {
    o += "\ncontested steps (sides still on the reference's path, grouped by their token):\n";
    if (r.contested.empty()) o += "  none\n";
    for (const GateContested& c : r.contested) {
      std::string line =
          "  prompt " + std::to_string(c.prompt + 1) + " step " + std::to_string(c.step) + ": ";
      for (size_t g = 0; g < c.groups.size(); ++g) {
        std::string names;
        for (size_t k = 0; k < c.groups[g].size(); ++k)
          names += (k ? (k + 1 == c.groups[g].size() ? " and " : ", ") : "") +
                   r.sides[size_t(c.groups[g][k])].label;
        std::string verb =
            c.groups[g].size() > 1 ? " agree on " : (g == 0 ? " has " : " differs: ");
        line += (g ? "; " : "") + names + verb + tok(r, c.tokens[g]);
      }
      if (!c.left_earlier.empty()) {
        line += " (already left: ";
        for (size_t k = 0; k < c.left_earlier.size(); ++k)
          line += (k ? ", " : "") + r.sides[size_t(c.left_earlier[k])].label;
        line += ")";
      }
      o += line + "\n";
    }
  }
  o += "\nVERDICT: " + std::string(verdict_name(r.verdict)) + " (" + r.verdict_reason + ")\n";
  return o;
}

nlohmann::json gate_json(const GateReport& r) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return nullptr;
  };
  nlohmann::json j;
  j["verdict"] = verdict_name(r.verdict);
  j["exit_code"] = int(r.verdict);
  j["reason"] = r.verdict_reason;
  j["model"] = r.model_path;
  j["prompts"] = {{"path", r.prompts_path}, {"sha256", r.prompts_sha256}, {"count", r.n_prompts}};
  j["tokens"] = r.n_tokens;
  j["runs"] = r.runs;
  j["band"] = r.band;
  j["tokenizer"] = {{"agree", r.tokenizers_agree}, {"note", r.tokenizer_note}};
  j["sides"] = nlohmann::json::array();
  for (const GateSideSummary& s : r.sides)
    j["sides"].push_back({{"side", s.label},
                          {"device", s.device},
                          {"compute", s.compute},
                          {"inject", s.inject},
                          {"consistent", s.consistent},
                          {"diverged", s.diverged},
                          {"near_ties", s.near_ties},
                          {"defects", s.defects}});
  j["inconsistencies"] = nlohmann::json::array();
  for (const GateInconsistency& in : r.inconsistencies)
    j["inconsistencies"].push_back({{"side", r.sides[size_t(in.side)].label},
                                    {"prompt", in.prompt + 1},
                                    {"run", in.run + 1},
                                    {"step", in.step},
                                    {"run0_token", in.run0_token},
                                    {"run_token", in.run_token}});
  j["divergences"] = nlohmann::json::array();
  for (const GateDivergence& d : r.divergences)
    j["divergences"].push_back({{"side", r.sides[size_t(d.side)].label},
                                {"prompt", d.prompt + 1},
                                {"step", d.step},
                                {"ref_token", d.j.ref_token},
                                {"side_token", d.j.side_token},
                                {"ref_top1", d.j.ref_top1},
                                {"ref_top2", d.j.ref_top2},
                                {"ref_gap", num(d.j.ref_gap)},
                                {"side_rank", d.j.side_rank},
                                {"deficit", num(d.j.deficit)},
                                {"side_logprob", num(d.j.side_logprob)},
                                {"side_own_gap", num(d.side_own_gap)},
                                {"class", d.j.near_tie ? "near-tie" : "defect"},
                                {"judged", d.counts}});
  j["contested"] = nlohmann::json::array();
  for (const GateContested& c : r.contested) {
    nlohmann::json groups = nlohmann::json::array();
    for (size_t g = 0; g < c.groups.size(); ++g) {
      nlohmann::json names = nlohmann::json::array();
      for (int s : c.groups[g]) names.push_back(r.sides[size_t(s)].label);
      groups.push_back({{"token", c.tokens[g]}, {"sides", names}});
    }
    nlohmann::json left = nlohmann::json::array();
    for (int s : c.left_earlier) left.push_back(r.sides[size_t(s)].label);
    j["contested"].push_back(
        {{"prompt", c.prompt + 1}, {"step", c.step}, {"groups", groups}, {"left_earlier", left}});
  }
  return j;
}

}  // namespace arbiter::verify
