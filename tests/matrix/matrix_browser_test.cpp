// report.html in a real browser: headless Chromium (Debian's `chromium`) loads the file with
// the network unused, the DOM it builds must hold the summary grid (one cell per model, shape
// and candidate), every table, every plot with data marks in it, and each SKIP reason exactly
// once; a screenshot is kept next to this test binary as an artefact (its path is printed).
// Without chromium the test says SKIP with the reason; it never passes without a browser.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "matrix_test_util.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// The part of html from the element with id to the first `end` after it ("" if no such id).
std::string element(const std::string& html, const std::string& id, const std::string& end) {
  size_t a = html.find("id=\"" + id + "\"");
  if (a == std::string::npos) return "";
  size_t b = html.find(end, a);
  return html.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

// Text as Chromium serialises it in a text node.
std::string html_text(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : std::string(1, c);
  return o;
}

std::string artefact_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? fs::path(std::string(buf, size_t(n))).parent_path().string()
               : fs::current_path().string();
}

}  // namespace

TEST(MatrixBrowser, ReportRendersInHeadlessChromium) {
  std::string chromium = find_chromium();
  if (chromium.empty()) {
    std::fprintf(
        stderr,
        "SKIP: chromium not installed (apt-get install chromium; scripts/install-deps.sh)\n");
    GTEST_SKIP() << "SKIP: chromium not installed (apt-get install chromium)";
  }
  test::enter_source_dir();
  std::string dir = test::temp_dir("browser-matrix");
  std::string spec = dir + ".toml";
  // cuda-f32 is skipped without a GPU (its reason must then appear once); with one it runs.
  test::write_file(spec, test::small_spec("[\"cpu\", \"cpu-bad\", \"cuda-f32\"]",
                                          "[arms.cpu-bad]\ndevice = \"cpu\"\nthreads = 2\n"
                                          "inject = \"op=down,layer=0,scale=10\"\n"
                                          "[arms.cuda-f32]\ndevice = \"cuda\"\ndtype = \"f32\"\n",
                                          "[\"w1\", \"w8\"]", "w1 = 32\nw8 = 4"));
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + " --quiet");
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;  // cpu-bad fails: both colours are on the page
  const std::string html = dir + "/report.html";
  const std::string profile = dir + "/chromium-profile";
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" + profile +
      " --window-size=1280,6000 ";
  const std::string dom_file = dir + "/dom.html";
  std::string dump = "timeout 120 " + chromium + flags + "--dump-dom file://" + html + " >" +
                     dom_file + " 2>" + dir + "/chromium-dom.log";
  ASSERT_EQ(std::system(dump.c_str()), 0) << test::read_file(dir + "/chromium-dom.log");
  std::string dom = test::read_file(dom_file);
  for (const char* id :
       {"summary-grid", "environment-table", "shapes-table", "arms-table", "results-table-0",
        "sweep-table", "rank-table", "aa-table", "noise-table", "providers-table"})
    EXPECT_NE(dom.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  // The summary grid leads: one verdict cell per (model, shape, candidate), each one a
  // link to its details (or to the skip reasons).
  std::string grid = element(dom, "summary-grid", "</table>");
  EXPECT_EQ(count(grid, "<td class=\"v-"), 1 * 2 * 3) << grid;
  EXPECT_EQ(count(grid, "<a href=\"#"), 1 * 2 * 3) << grid;
  EXPECT_LT(dom.find("id=\"summary-grid\""), dom.find("id=\"results-table-0\""));
  EXPECT_GT(count(grid, "class=\"v-fail\""), 0);
  EXPECT_GT(count(grid, "class=\"v-pass\""), 0);
  EXPECT_NE(dom.find("id=\"detail-TinyStories-656K-w1-cpu-bad-vs-ref\""), std::string::npos);
  // Every plot holds data marks.
  int figures = 0;
  for (const char* kind : {"delta", "kl", "sweep", "nll"})
    for (const char* shape : {"w1", "w8"}) {
      std::string fig =
          element(dom, std::string("plot-TinyStories-656K-") + shape + "-" + kind, "</figure>");
      EXPECT_FALSE(fig.empty()) << kind << " " << shape;
      EXPECT_GT(count(fig, "class=\"mark\"") + count(fig, "class=\"bar mark\""), 0)
          << kind << " " << shape;
      figures += !fig.empty();
    }
  EXPECT_EQ(count(dom, "<figure"), figures);
  // cpu never disagrees at a decided threshold: its sweep panel says "all zero" rather than
  // drawing a symmetric axis around nothing.
  EXPECT_GE(count(element(dom, "plot-TinyStories-656K-w1-sweep", "</figure>"), ">all zero<"), 1);
  // Each distinct SKIP reason is stated once, however many comparisons it covers.
  nlohmann::json j = test::read_json(dir + "/results.json");
  std::set<std::string> reasons;
  for (const auto& c : j["comparisons"])
    if (c["state"] == "skipped") reasons.insert(c["why"].get<std::string>());
  for (const auto& why : reasons) EXPECT_EQ(count(dom, html_text(why)), 1) << why;
  if (reasons.empty()) std::printf("(a CUDA device ran cuda-f32: no SKIP reason to count)\n");
  // Markdown by CommonMark: no emphasis invented inside "ARBITER_* env" (issue 32).
  EXPECT_EQ(count(dom, "ARBITER_* env"), 1);
  EXPECT_EQ(count(dom, "<script"), 0);
  EXPECT_EQ(count(dom, "http://") + count(dom, "https://"),
            count(dom, "http://www.w3.org/2000/svg"))
      << "the report must not reference the network";

  const std::string shot = artefact_dir() + "/matrix_report_screenshot.png";
  fs::remove(shot);
  std::string cmd = "timeout 120 " + chromium + flags + "--screenshot=" + shot + " file://" + html +
                    " >" + dir + "/chromium-shot.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_file(dir + "/chromium-shot.log");
  std::string png = test::read_file(shot);
  ASSERT_GT(png.size(), 10000u) << shot;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::printf("[ artefact ] screenshot of report.html: %s (%zu bytes)\n", shot.c_str(), png.size());
}
