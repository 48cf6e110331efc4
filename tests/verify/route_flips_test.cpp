// Routing flips (verify/judge/route_flips.h) and the routes column of traces: flip counting
// and classing on hand-built routes (each expected count worked out by hand in the comment
// beside it), the `# routes` header and routes column round trip, the reader's refusals of
// malformed routes, and compare's report of the flips between two hand-written traces (in
// process and through the CLI's --route-decided, --explain and store compare).
// To add a counting case: build samples with rs(), write the expected counts by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixtures.h"
#include "test_util.h"
#include "verify/judge/compare.h"
#include "verify/judge/route_flips.h"
#include "verify/trace/trace.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

RouteSample rs(int pos, int layer, std::vector<int32_t> ids, double margin) {
  return {0, pos, layer, std::move(ids), margin};
}

// A routed header (2 MoE layers 0 and 2 of 4 experts, top-2) and six_rows() with routes:
// every row sends its token to experts {0,1} at layer 0 and {2,3} at layer 2, margins 0.5.
TraceHeader routed_header() {
  TraceHeader h = fixture_header();
  h.routes = {4, 2, "softmax", {0, 2}};
  return h;
}
std::vector<TraceRow> routed_rows() {
  std::vector<TraceRow> rows = six_rows();
  for (TraceRow& r : rows) r.routes = {{{1, 0}, 0.5}, {{2, 3}, 0.5}};
  return rows;
}

}  // namespace

TEST(RouteFlips, CountsAndClassesByTheReferenceMargin) {
  const std::vector<RouteSample> ref = {
      rs(0, 0, {1, 2}, 0.3),     // cand {2, 1}: the same set in another order, no flip
      rs(0, 2, {0, 3}, 0.004),   // cand {0, 1}: a flip at margin 0.004 < 0.01: near-tie
      rs(1, 0, {5, 6}, 0.25),    // cand {5, 7}: a flip at 0.25: decided
      rs(1, 2, {4, 6}, 0.01),    // cand {6, 7}: margin exactly at the threshold: decided
      rs(2, 0, {0, 1}, 0.2),     // no partner in cand: unmatched
  };
  const std::vector<RouteSample> cand = {
      rs(0, 0, {2, 1}, 0.3), rs(0, 2, {0, 1}, 0.001), rs(1, 0, {5, 7}, 0.02),
      rs(1, 2, {6, 7}, 0.1),
      rs(3, 0, {0, 1}, 0.2),  // no partner in ref: unmatched
  };
  const RouteFlips f = count_route_flips(ref, cand, 0.01);
  EXPECT_TRUE(f.compared);
  EXPECT_EQ(f.pairs, 4);
  EXPECT_EQ(f.unmatched, 2);
  EXPECT_EQ(f.flips, 3);
  EXPECT_EQ(f.decided, 2);
  EXPECT_EQ(f.near_tie, 1);
  EXPECT_DOUBLE_EQ(f.max_margin_at_flip, 0.25);
  ASSERT_EQ(f.layers.size(), 2u);
  EXPECT_EQ(f.layers[0].layer, 0);
  EXPECT_EQ(f.layers[0].pairs, 2);
  EXPECT_EQ(f.layers[0].flips, 1);
  EXPECT_EQ(f.layers[0].decided, 1);
  EXPECT_EQ(f.layers[1].layer, 2);
  EXPECT_EQ(f.layers[1].flips, 2);
  EXPECT_EQ(f.layers[1].decided, 1);
  // Largest reference margin first: 0.25 (pos 1, L0), 0.01 (pos 1, L2), 0.004 (pos 0, L2).
  ASSERT_EQ(f.worst.size(), 3u);
  EXPECT_EQ(f.worst[0].layer, 0);
  EXPECT_EQ(f.worst[0].cand_ids, (std::vector<int32_t>{5, 7}));
  EXPECT_DOUBLE_EQ(f.worst[1].ref_margin, 0.01);
  EXPECT_DOUBLE_EQ(f.worst[2].ref_margin, 0.004);
  const std::string text = format_route_flips(f, "");
  EXPECT_NE(text.find("flips  3 / 4 (position, layer) pairs: 2 decided (ref margin >= 0.01), 1 near-tie"),
            std::string::npos) << text;
  EXPECT_NE(text.find("DECIDED"), std::string::npos) << text;
  EXPECT_NE(text.find("near-tie"), std::string::npos) << text;
  const nlohmann::json j = to_json(f);
  EXPECT_EQ(j.at("decided"), 2);
  EXPECT_EQ(j.at("near_tie"), 1);
  EXPECT_EQ(j.at("worst").at(0).at("class"), "decided");
  EXPECT_EQ(j.at("worst").at(2).at("class"), "near-tie");

  // The threshold decides the class, not whether a flip counts: at 0.3 all three are near-ties.
  const RouteFlips g = count_route_flips(ref, cand, 0.3);
  EXPECT_EQ(g.flips, 3);
  EXPECT_EQ(g.decided, 0);
  EXPECT_EQ(g.near_tie, 3);
}

TEST(RouteFlips, NoFlipsAndANanMargin) {
  const std::vector<RouteSample> same = {rs(0, 1, {3, 0}, 1e-9), rs(1, 1, {2, 1}, 0.0)};
  const RouteFlips none = count_route_flips(same, same, 0.01);
  EXPECT_EQ(none.pairs, 2);
  EXPECT_EQ(none.flips, 0);
  EXPECT_TRUE(std::isnan(none.max_margin_at_flip));
  EXPECT_EQ(to_json(none).at("max_margin_at_flip"), nullptr);
  // A reference router that produced NaN decided nothing legitimately: such a flip is decided.
  const RouteFlips nan = count_route_flips({rs(0, 0, {0, 1}, std::nan(""))}, {rs(0, 0, {0, 2}, 0.1)}, 0.01);
  EXPECT_EQ(nan.decided, 1);
  EXPECT_EQ(nan.near_tie, 0);
}

TEST(TraceRoutes, RoundTripAndDenseTracesUnchanged) {
  const std::string dir = temp_dir("trace-routes");
  TraceHeader h = routed_header();
  std::vector<TraceRow> rows = routed_rows();
  rows[3].routes[1] = {{3, 0}, INFINITY};  // k == E would give inf
  const std::string path = write_trace(dir + "/r.tsv", h, rows);
  const Trace t = read_trace(path);
  EXPECT_EQ(t.header.routes.experts, 4);
  EXPECT_EQ(t.header.routes.top_k, 2);
  EXPECT_EQ(t.header.routes.score, "softmax");
  EXPECT_EQ(t.header.routes.layers, (std::vector<int>{0, 2}));
  EXPECT_TRUE(t.header.extra.empty()) << "the routes line is not an unknown key";
  ASSERT_EQ(t.rows.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(t.rows[i].routes.size(), 2u);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(t.rows[i].routes[l].ids, rows[i].routes[l].ids);
      EXPECT_EQ(t.rows[i].routes[l].margin, rows[i].routes[l].margin);
    }
  }
  const std::string text = read_file(path);
  EXPECT_NE(text.find("\n# routes\texperts\t4\ttop_k\t2\tscore\tsoftmax\tlayers\t0,2\n"), std::string::npos);
  EXPECT_NE(text.find("\ttop_logits\troutes\n"), std::string::npos);
  EXPECT_NE(text.find("\t1,0/0.5;2,3/0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\t1,0/0.5;3,0/inf\n"), std::string::npos) << text;

  // A dense trace (no routes) is written exactly as before: no routes line, nine columns.
  const std::string dense = read_file(write_trace(dir + "/d.tsv", fixture_header(), six_rows()));
  EXPECT_EQ(dense.find("routes"), std::string::npos);
  EXPECT_TRUE(read_trace(dir + "/d.tsv").header.routes.layers.empty());

  // The writer refuses a row whose routes do not match the header.
  TraceWriter w;
  w.open(dir + "/w.tsv", h);
  TraceRow bad = rows[0];
  bad.routes.pop_back();
  EXPECT_THROW(w.write_row(bad), Error);
  bad = rows[0];
  bad.routes[0].ids = {1};
  EXPECT_THROW(w.write_row(bad), Error);
  TraceWriter w2;
  w2.open(dir + "/w2.tsv", fixture_header());
  EXPECT_THROW(w2.write_row(rows[0]), Error) << "routes in a trace without a routes header";
}

TEST(TraceRoutes, ReaderRefusesMalformedRoutes) {
  const std::string dir = temp_dir("trace-routes-bad");
  const std::string good = read_file(write_trace(dir + "/good.tsv", routed_header(), routed_rows()));
  auto swap = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const std::string row0 = "\t1,0/0.5;2,3/0.5\n";
  struct Case {
    const char* name;
    std::string text, want;
  } cases[] = {
      {"entries", swap(row0, "\t1,0/0.5\n"), "routes: 1 entries (the '# routes' line lists 2 layers)"},
      {"no_margin", swap(row0, "\t1,0;2,3/0.5\n"), "routes at layer 0: expected 'ids/margin'"},
      {"k", swap(row0, "\t1/0.5;2,3/0.5\n"), "routes at layer 0: 1 experts (top_k 2)"},
      {"range", swap(row0, "\t1,4/0.5;2,3/0.5\n"), "routes expert id: 4 out of range [0, 3]"},
      {"twice", swap(row0, "\t1,1/0.5;2,3/0.5\n"), "routes at layer 0: an expert is chosen twice"},
      {"negative", swap(row0, "\t1,0/-0.5;2,3/0.5\n"), "routes at layer 0: negative margin"},
      {"missing_column", swap(row0, "\n"), "row has 9 columns (expected 10)"},
      {"no_header", swap("# routes\texperts\t4\ttop_k\t2\tscore\tsoftmax\tlayers\t0,2\n", ""),
       "'# columns' line lists 'routes' but no '# routes' line"},
      {"no_column", swap("\ttop_logits\troutes\n", "\ttop_logits\n"),
       "does not list the v1 columns and 'routes'"},
      {"layers", swap("layers\t0,2\n", "layers\t2,0\n"), "layers must be ascending"},
      {"topk", swap("top_k\t2\t", "top_k\t5\t"), "routes top_k: 5 out of range [1, 4]"},
  };
  for (const Case& c : cases) {
    const std::string p = dir + "/" + c.name + ".tsv";
    write_file(p, c.text);
    const std::string msg = read_trace_error(p);
    EXPECT_NE(msg.find("[trace] " + p + ":"), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(TraceRoutes, CompareReportsFlipsAndWhyNotCompared) {
  const std::string dir = temp_dir("trace-routes-cmp");
  const std::string ref = write_trace(dir + "/ref.tsv", routed_header(), routed_rows());
  std::vector<TraceRow> rows = routed_rows();
  rows[1].routes[0].ids = {0, 3};  // chunk 0 pos 1, layer 0: {0,1} -> {0,3}
  rows[5].routes[1].ids = {1, 3};  // chunk 1 pos 2, layer 2: {2,3} -> {1,3}
  const std::string cand = write_trace(dir + "/cand.tsv", routed_header(), rows);
  CompareOptions opt;
  CompareResult r = compare_traces(read_trace(ref), read_trace(cand), opt);
  EXPECT_TRUE(r.routes.compared);
  EXPECT_EQ(r.routes.pairs, 12);  // 6 positions x 2 layers
  EXPECT_EQ(r.routes.flips, 2);
  EXPECT_EQ(r.routes.decided, 2);  // reference margins 0.5 >= 0.01
  EXPECT_EQ(r.verdict, Verdict::Pass) << "routing flips are evidence, not a gate";
  EXPECT_NE(format_report(r).find("routing flips (expert sets that differ, classed by the reference's softmax margin)"),
            std::string::npos) << format_report(r);
  EXPECT_EQ(to_json(r).at("routing_flips").at("flips"), 2);
  opt.route_decided = 0.75;
  EXPECT_EQ(compare_traces(read_trace(ref), read_trace(cand), opt).routes.near_tie, 2);
  // The same through the CLI: --route-decided moves the class; a bad value is one line, exit 4.
  const CliResult cli = run_cli("compare " + ref + " " + cand + " --route-decided 0.75 --json");
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(nlohmann::json::parse(cli.out).at("routing_flips").at("near_tie"), 2) << cli.out;
  const CliResult bad = run_cli("compare " + ref + " " + cand + " --route-decided -1");
  EXPECT_EQ(bad.exit_code, 4);
  EXPECT_NE(bad.err.find("--route-decided must be a number >= 0 (got -1)"), std::string::npos) << bad.err;
  // --explain states the rule with this run's counts.
  const CliResult ex = run_cli("compare " + ref + " " + cand + " --explain");
  EXPECT_NE(ex.out.find("routing flips: a (position, layer) pair flips when the two sides' expert sets differ"),
            std::string::npos) << ex.out;
  EXPECT_NE(ex.out.find("2 of 12 pairs flip, 2 decided + 0 near-tie"), std::string::npos) << ex.out;
  // store compare reports the flips of each pair and takes the same option.
  const std::string sr = dir + "/store-ref", sc = dir + "/store-cand";
  for (const auto& [d, f] : {std::pair{sr, ref}, std::pair{sc, cand}}) {
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(f, d + "/t.tsv");
    ASSERT_EQ(run_cli("store add " + d + " " + d + "/t.tsv").exit_code, 0);
  }
  const CliResult st = run_cli("store compare " + sr + " " + sc + " --route-decided 0.75");
  EXPECT_NE(st.out.find("flips  2 / 12 (position, layer) pairs: 0 decided (ref margin >= 0.75), 2 near-tie"),
            std::string::npos) << st.out;

  // One side without routes: said, not silently skipped; two dense traces: nothing printed.
  const std::string dense = write_trace(dir + "/dense.tsv", fixture_header(), six_rows());
  r = compare_traces(read_trace(ref), read_trace(dense), CompareOptions{});
  EXPECT_FALSE(r.routes.compared);
  EXPECT_NE(format_report(r).find("routing flips: not compared (only the reference trace records routes)"),
            std::string::npos) << format_report(r);
  r = compare_traces(read_trace(dense), read_trace(dense), CompareOptions{});
  EXPECT_FALSE(r.routes.recorded);
  EXPECT_EQ(format_report(r).find("routing flips"), std::string::npos);
}
