// Trace format v1: writer -> reader round trip, the reader's refusals (each with file and
// line), the foreign 6-column format, named shapes, the full-logits file, and a fuzz test
// (random truncations / byte edits never crash the reader). To add a refusal case, append
// to the table in ReaderRefuses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "fixtures.h"
#include "test_util.h"
#include "verify/judge/compare.h"
#include "verify/trace/trace.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

TEST(NamedShapes, MatchDesignTable) {
  // DESIGN.md §3: name W chunks prefill start.
  struct Row {
    const char* name;
    int W, C, P, S;
  } expected[] = {{"w1", 1, 128, 0, 0},
                  {"w1ctx512", 1, 128, 512, 512},
                  {"w8", 8, 80, 512, 0},
                  {"w256", 256, 2, 0, 0},
                  {"w8ctx1536", 8, 40, 1536, 1536}};
  ASSERT_EQ(named_shapes().size(), std::size(expected));
  for (const auto& e : expected) {
    TraceShape s = named_shape(e.name);
    EXPECT_EQ(s.chunk_tokens, e.W) << e.name;
    EXPECT_EQ(s.max_chunks, e.C) << e.name;
    EXPECT_EQ(s.prefill, e.P) << e.name;
    EXPECT_EQ(s.start_token, e.S) << e.name;
  }
  try {
    named_shape("w9");
    FAIL() << "unknown shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w8ctx1536"), std::string::npos) << e.what();
  }
}

TEST(TraceFloat, Spellings) {
  EXPECT_EQ(format_trace_float(std::nan("")), "nan");
  EXPECT_EQ(format_trace_float(INFINITY), "inf");
  EXPECT_EQ(format_trace_float(-INFINITY), "-inf");
  EXPECT_EQ(format_trace_float(0.1), "0.1");
  EXPECT_EQ(format_trace_float(1.0 / 3.0), "0.333333333");  // %.9g
  // %.9g round-trips every float32.
  float f = 0.1f;
  EXPECT_EQ(float(std::stod(format_trace_float(f))), f);
}

TEST(TraceWriter, RoundTrip) {
  std::string dir = temp_dir("trace-rt");
  TraceHeader h = fixture_header();
  h.env = {"ARBITER_X=1", "ARBITER_Y=two"};
  h.inject = "op=rmsnorm,layer=2,scale=1.5";
  h.extra = {{"host", "box1"}, {"note", "a\tb"}};
  h.act_quant = "q8_0,q8_K";
  auto rows = six_rows();
  rows[2].top_logits = {INFINITY, 3.0, 2.0};
  rows[4].nll = std::nan("");
  std::string path = write_trace(dir + "/t.tsv", h, rows, 12.25);

  Trace t = read_trace(path);
  EXPECT_EQ(t.format, TraceFormat::Arbiter);
  const TraceHeader& g = t.header;
  EXPECT_EQ(g.model_path, h.model_path);
  EXPECT_EQ(g.model_sha256, h.model_sha256);
  EXPECT_EQ(g.model_arch, "llama");
  EXPECT_EQ(g.model_params, 656000);
  EXPECT_EQ(g.tokenizer_sha256, h.tokenizer_sha256);
  EXPECT_EQ(g.tokenizer_bos, "1");
  EXPECT_EQ(g.corpus_path, "corpus.txt");
  EXPECT_EQ(g.corpus_sha256, h.corpus_sha256);
  EXPECT_EQ(g.corpus_tokens, 5000);
  EXPECT_EQ(g.shape_name, "custom");
  EXPECT_EQ(g.chunk_tokens, 3);
  EXPECT_EQ(g.max_chunks, 2);
  EXPECT_EQ(g.topk, 3);
  EXPECT_EQ(g.prefill, 0);
  EXPECT_EQ(g.start_token, 0);
  EXPECT_EQ(g.device, "cpu");
  EXPECT_EQ(g.compute, "f32");
  EXPECT_EQ(g.weights, "f32");
  EXPECT_EQ(g.providers, h.providers);
  EXPECT_EQ(g.fallbacks, 0);
  EXPECT_EQ(g.act_quant, "q8_0,q8_K");
  EXPECT_EQ(g.inject, h.inject);
  EXPECT_EQ(g.build_version, "0.1.0");
  EXPECT_EQ(g.build_commit, "abcdef123456");
  EXPECT_EQ(g.build_compiler, "gcc-12.2.0");
  EXPECT_EQ(g.build_cuda, "none");
  EXPECT_EQ(g.env, h.env);
  ASSERT_EQ(g.extra.size(), 2u);
  EXPECT_EQ(g.extra[0], (std::pair<std::string, std::string>{"host", "box1"}));
  EXPECT_EQ(g.extra[1], (std::pair<std::string, std::string>{"note", "a\tb"}));
  EXPECT_DOUBLE_EQ(t.elapsed_s, 12.25);
  ASSERT_EQ(t.rows.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const TraceRow &a = rows[i], &b = t.rows[i];
    EXPECT_EQ(a.chunk, b.chunk);
    EXPECT_EQ(a.pos, b.pos);
    EXPECT_EQ(a.abs_pos, b.abs_pos);
    EXPECT_EQ(a.target, b.target);
    if (std::isnan(a.nll)) EXPECT_TRUE(std::isnan(b.nll));
    else EXPECT_EQ(a.nll, b.nll);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.top_ids, b.top_ids);
    EXPECT_EQ(a.top_logits, b.top_logits);
  }
  // NaN nll in row 4 (its target_logit was computed before, stays finite), +inf in row 2.
  EXPECT_EQ(t.nonfinite_values, 2);
  EXPECT_EQ(t.nonfinite_rows, 2);
  // The file's own text: floats as %.9g, inf/nan spelled out, the end line.
  std::string text = read_file(path);
  EXPECT_EQ(text.rfind("# arbiter-trace\t1\n", 0), 0u);
  EXPECT_NE(text.find("\n# end\trows\t6\telapsed_s\t12.25\n"), std::string::npos);
  EXPECT_NE(text.find("\tinf,3,2\n"), std::string::npos);
  EXPECT_NE(text.find("\tnan\t"), std::string::npos);
  EXPECT_NE(text.find("\n# act_quant\tq8_0,q8_K\n# inject\t"), std::string::npos);
  // No activation quantization: no line (traces of tiers that never quantize stay as before).
  h.act_quant.clear();
  const std::string plain = read_file(write_trace(dir + "/plain.tsv", h, six_rows(), 1.0));
  EXPECT_EQ(plain.find("act_quant"), std::string::npos);
  EXPECT_EQ(read_trace(dir + "/plain.tsv").header.act_quant, "");
}

TEST(TraceWriter, AtomicAndCountsNonFinite) {
  std::string dir = temp_dir("trace-atomic");
  std::string path = dir + "/t.tsv";
  {
    TraceWriter w;
    w.open(path, fixture_header());
    auto rows = six_rows();
    rows[0].lse = -INFINITY;
    for (const auto& r : rows) w.write_row(r);
    EXPECT_EQ(w.rows(), 6);
    EXPECT_EQ(w.nonfinite_values(), 1);  // lse = -inf
    EXPECT_FALSE(std::filesystem::exists(path)) << "final path must not exist before finish";
    EXPECT_TRUE(std::filesystem::exists(w.temp_path()));
    // destroyed without finish
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "temporary file left behind";

  TraceWriter w;
  w.open(path, fixture_header());
  TraceRow bad = six_rows()[0];
  bad.top_ids.pop_back();
  EXPECT_THROW(w.write_row(bad), Error);
  TraceHeader h = fixture_header();
  h.model_path = "a\tb";
  TraceWriter w2;
  EXPECT_THROW(w2.open(dir + "/u.tsv", h), Error);
}

TEST(TraceReader, RefusesIncompleteAndMalformed) {
  std::string dir = temp_dir("trace-bad");
  std::string good = read_file(write_trace(dir + "/good.tsv", fixture_header(), six_rows()));
  // Line numbers: 1 arbiter-trace, 2 model, ..., 10 env, 11 columns, 12-17 rows, 18 end.
  auto replace_line = [&](int n, const std::string& with) {
    size_t s = 0;
    for (int i = 1; i < n; ++i) s = good.find('\n', s) + 1;
    size_t e = good.find('\n', s);
    return good.substr(0, s) + with + good.substr(e);
  };
  auto cut_before_end = good.substr(0, good.find("# end"));
  struct Case {
    const char* name;
    std::string text;
    std::string want;  // substring of the message, includes ":LINE:"
  } cases[] = {
      {"no_end", cut_before_end, ":17: no '# end' line"},
      {"rows_mismatch", replace_line(18, "# end\trows\t7\telapsed_s\t1.5"), ":18: '# end' says 7 rows"},
      {"cut_mid_line", good.substr(0, good.size() - 5), ":18: last line has no newline"},
      {"bad_columns", replace_line(13, "0\t1\t101\t21\t2"), ":13: row has 5 columns"},
      {"bad_number", replace_line(14, "0\t2\t102\t30\t0.5x\t6.5\t7\t30,31,32\t6,3,2"),
       ":14: nll: '0.5x' is not a number"},
      {"bad_int", replace_line(12, "0\t-1\t100\t10\t1\t5\t6\t10,11,12\t5,2,1"), ":12: pos: -1 out of range"},
      {"not_descending", replace_line(12, "0\t0\t100\t10\t1\t5\t6\t10,11,12\t5,6,1"),
       ":12: top_logits not in descending order"},
      {"tie_order", replace_line(12, "0\t0\t100\t10\t1\t5\t6\t11,10,12\t5,5,1"),
       ":12: top_logits not in descending order"},
      {"wrong_k", replace_line(12, "0\t0\t100\t10\t1\t5\t6\t10,11\t5,2"), ":12: row has 2 top-k entries"},
      {"ids_logits", replace_line(12, "0\t0\t100\t10\t1\t5\t6\t10,11,12\t5,2"), ":12: top_ids has 3 entries"},
      {"dup_id", replace_line(12, "0\t0\t100\t10\t1\t5\t6\t10,10,12\t5,2,1"), ":12: top_ids repeats"},
      {"dup_pos", replace_line(13, "0\t0\t100\t10\t1\t5\t6\t10,11,12\t5,2,1"), ":13: duplicate row"},
      {"bad_header", replace_line(2, "# model\tm\tsha256\tx\tarch"), ":2: '# model' line: expected 7"},
      {"dup_header", replace_line(3, "# model\tm\tsha256\tx\tarch\ta\tparams\t1"), ":3: duplicate"},
      {"version", replace_line(1, "# arbiter-trace\t2"), ":1: unsupported arbiter-trace version 2"},
      {"after_end", good + "0\t0\t1\t1\t1\t1\t1\t1,2,3\t3,2,1\n", ":19: content after"},
      {"empty_line", replace_line(13, ""), ":13: empty line"},
      {"header_after_cols", replace_line(12, "# note\tx"), ":12: header line '# note' after"},
      {"missing_model", replace_line(2, "# other\tx"), ":11: no '# model' line"},
      {"empty", "", ":1: empty file"},
      {"latin1", replace_line(2, "# model\tm\xe9\tsha256\tx\tarch\ta\tparams\t1"),
       ":2: byte 27 is not valid UTF-8"},
      {"overlong", replace_line(2, "# model\tm\xc0\xaf\tsha256\tx\tarch\ta\tparams\t1"),
       ":2: byte 27 is not valid UTF-8"},
  };
  for (const auto& c : cases) {
    std::string p = dir + "/" + c.name + ".tsv";
    write_file(p, c.text);
    std::string msg = read_trace_error(p);
    EXPECT_NE(msg.find("[trace] " + p + ":"), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": " << msg;
  }
  EXPECT_NE(read_trace_error(dir + "/absent.tsv").find("cannot open"), std::string::npos);
  // Well-formed multi-byte UTF-8 in a path is fine.
  write_file(dir + "/utf8.tsv", replace_line(2, "# model\tm\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\tsha256\tx"
                                                "\tarch\ta\tparams\t1"));
  EXPECT_EQ(read_trace(dir + "/utf8.tsv").header.model_path, "m\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST(TraceReader, ForeignSixColumn) {
  std::string dir = temp_dir("trace-foreign");
  std::string p = dir + "/other.tsv";
  write_file(p,
             "# model: tiny-llama.gguf\n"
             "# engine=other 1.2\n"
             "chunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n"
             "0\t0\t5\t1.25\t5,7\t3.5,1.25\n"
             "0\t1\t9\t2.5\t7,9\t2,-1e+01\n"
             "1\t0\t2\tNaN\t2,3\t-inf,-inf\n");
  Trace t = read_trace(p);
  EXPECT_EQ(t.format, TraceFormat::Foreign);
  EXPECT_FALSE(t.has_lse);
  EXPECT_FALSE(t.has_abs_pos);
  EXPECT_EQ(t.header.topk, 2);
  EXPECT_EQ(t.header.model_sha256, "");  // unknown
  ASSERT_EQ(t.header.extra.size(), 2u);
  EXPECT_EQ(t.header.extra[0].first, "model");
  EXPECT_EQ(t.header.extra[0].second, "tiny-llama.gguf");
  EXPECT_EQ(t.header.extra[1].first, "engine");
  EXPECT_EQ(t.header.extra[1].second, "other 1.2");
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[1].target, 9);
  EXPECT_EQ(t.rows[1].nll, 2.5);
  EXPECT_EQ(t.rows[1].top_logits[1], -10.0);
  EXPECT_EQ(t.rows[0].abs_pos, -1);
  EXPECT_TRUE(std::isnan(t.rows[0].lse));
  EXPECT_EQ(t.nonfinite_values, 3);  // NaN nll, two -inf
  // Without the column header line, with CRLF line ends.
  write_file(p, "0\t0\t5\t1.25\t5,7\t3.5,1.25\r\n0\t1\t9\t2.5\t7,9\t2,1\r\n");
  EXPECT_EQ(read_trace(p).rows.size(), 2u);
  // Malformed foreign rows name the line.
  write_file(p, "# x\nchunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n0\t0\t5\t1.25\t5,7\n");
  EXPECT_NE(read_trace_error(p).find(":3: row has 5 columns"), std::string::npos);
  write_file(p, "# only metadata\n");
  EXPECT_NE(read_trace_error(p).find("no rows"), std::string::npos);
  write_file(p, "0\t0\t5\t1.25\t5,7\t3.5,1.25\n0\t0\t5\t1.25\t5,7\t3.5,1.25\n");
  EXPECT_NE(read_trace_error(p).find(":2: duplicate row"), std::string::npos);
}

TEST(LogitsFile, RoundTripAndRefusals) {
  std::string dir = temp_dir("logits");
  std::string p = dir + "/t.logits";
  {
    LogitsWriter w;
    w.open(p, 3);
    float a[3] = {1.5f, -2.0f, 0.25f}, b[3] = {0, 1, 2};
    w.write_row(a);
    w.write_row(b);
    EXPECT_FALSE(std::filesystem::exists(p));
    w.finish();
  }
  std::string bytes = read_file(p);
  ASSERT_EQ(bytes.size(), 31u + 2 * 3 * 4);
  EXPECT_EQ(bytes.substr(0, 15), std::string("arbiter-logits\0", 15));
  EXPECT_EQ(uint8_t(bytes[15]), 1);  // version u32 LE
  EXPECT_EQ(uint8_t(bytes[19]), 2);  // rows u64 LE
  EXPECT_EQ(uint8_t(bytes[27]), 3);  // vocab u32 LE
  LogitsReader r(p);
  EXPECT_EQ(r.rows(), 2u);
  EXPECT_EQ(r.vocab(), 3u);
  std::vector<float> row;
  r.read_row(1, row);
  EXPECT_EQ(row, (std::vector<float>{0, 1, 2}));
  r.read_row(0, row);
  EXPECT_EQ(row[1], -2.0f);
  EXPECT_THROW(r.read_row(2, row), Error);

  write_file(dir + "/short.logits", bytes.substr(0, bytes.size() - 1));
  EXPECT_THROW(LogitsReader(dir + "/short.logits"), Error);
  std::string bad = bytes;
  bad[0] = 'X';
  write_file(dir + "/magic.logits", bad);
  EXPECT_THROW(LogitsReader(dir + "/magic.logits"), Error);
  { LogitsWriter w; w.open(dir + "/gone.logits", 2); }
  EXPECT_FALSE(std::filesystem::exists(dir + "/gone.logits"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 3);
}

// Random truncations and byte edits of a valid trace: read_trace must either succeed or
// throw arbiter::Error -- never crash or throw anything else -- and whatever it accepts must
// go through compare_traces without crashing. Seeded; the seed and case print on failure.
TEST(TraceReader, FuzzNeverCrashes) {
  std::string dir = temp_dir("trace-fuzz");
  auto rows = six_rows();
  std::string good_path = write_trace(dir + "/good.tsv", fixture_header(), rows);
  Trace ref = read_trace(good_path);
  // Both formats: the arbiter trace and a foreign 6-column one.
  const std::string bases[] = {
      read_file(good_path),
      "# engine x\nchunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n0\t0\t10\t1\t10,11,12\t5,2,1\n"
      "0\t1\t21\t2\t20,21,22\t4,3.5,1\n0\t2\t30\t0.5\t30,31,32\t6,3,2\n"};
  std::mt19937 rng(12345);
  const char alphabet[] = "0123456789\t\n,.-#e naif";
  int accepted = 0, refused = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string s = bases[it % 2];
    int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s.resize(at); break;                                         // truncate
        case 1: s[at] = char(rng() % 256); break;                            // any byte
        case 2: s[at] = alphabet[rng() % (sizeof alphabet - 1)]; break;      // plausible byte
        case 3: s.insert(s.begin() + long(at), alphabet[rng() % (sizeof alphabet - 1)]); break;
        case 4: s.erase(at, 1 + rng() % 8); break;
      }
    }
    std::string p = dir + "/f.tsv";
    write_file(p, s);
    try {
      Trace t = read_trace(p);
      ++accepted;
      CompareResult r = compare_traces(ref, t, CompareOptions{});
      (void)format_report(r);
      (void)to_json(r).dump();
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "seed 12345 iteration " << it << ": non-arbiter exception " << e.what();
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);  // some edits (e.g. a digit in elapsed_s) leave a valid trace
}
