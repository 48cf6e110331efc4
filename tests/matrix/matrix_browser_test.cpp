// report.html in a real browser: headless Chromium (Debian's `chromium`) loads the file with
// the network unused, the DOM it builds must hold the report's tables and SVG plots, and a
// screenshot is kept next to this test binary as an artefact (its path is printed). Without
// chromium the test says SKIP with the reason; it never passes without a browser.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

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
  test::write_file(spec, test::small_spec("[\"cpu\", \"cpu-bad\"]",
                                          "[arms.cpu-bad]\ndevice = \"cpu\"\nthreads = 2\n"
                                          "inject = \"op=down,layer=0,scale=10\"\n",
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
  for (const char* id : {"environment-table", "shapes-table", "arms-table", "results-table-0",
                         "sweep-table", "rank-table", "aa-table", "noise-table", "providers-table"})
    EXPECT_NE(dom.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  for (const char* kind : {"gap", "rank", "nll"})
    for (const char* shape : {"w1", "w8"})
      EXPECT_NE(dom.find(std::string("id=\"plot-TinyStories-656K-") + shape + "-" + kind + "\""),
                std::string::npos)
          << kind << " " << shape;
  EXPECT_EQ(count(dom, "<svg"), 6);
  EXPECT_GT(count(dom, "<rect class=\"bar\""), 0);
  EXPECT_GT(count(dom, "<path class=\"series\""), 0);
  EXPECT_GT(count(dom, "class=\"v-fail\""), 0);
  EXPECT_GT(count(dom, "class=\"v-pass\""), 0);
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
