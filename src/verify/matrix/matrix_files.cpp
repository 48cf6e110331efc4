#include "verify/matrix/matrix_files.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "verify/matrix/matrix_run.h"

namespace arbiter::verify {

static std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string data_rows(const std::string& text) {
  size_t a = text.find("\n# columns");
  a = a == std::string::npos ? 0 : text.find('\n', a + 1);
  size_t b = text.rfind("\n# end");
  if (a == std::string::npos || b == std::string::npos || b < a) return "";
  return text.substr(a + 1, b - a);
}

bool rows_identical(const std::string& a_path, const std::string& b_path, std::string& detail) {
  std::string a = data_rows(read_all(a_path)), b = data_rows(read_all(b_path));
  if (a == b) {
    detail = "all rows byte-identical";
    return true;
  }
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int row = 0;; ++row) {
    bool ga = bool(std::getline(sa, la)), gb = bool(std::getline(sb, lb));
    if (!ga || !gb || la != lb) {
      detail = strformat("row %d differs", row);
      if (ga && gb) {
        size_t t1 = la.find('\t'), t2 = la.find('\t', t1 + 1);
        detail += " (chunk " + la.substr(0, t1) + ", pos " + la.substr(t1 + 1, t2 - t1 - 1) + ")";
      } else {
        detail += " (one trace has fewer rows)";
      }
      return false;
    }
  }
}

std::map<std::string, std::pair<std::string, std::string>> read_status(const std::string& dir) {
  std::map<std::string, std::pair<std::string, std::string>> out;
  std::istringstream in(read_all(dir + "/" + kMatrixStatus));
  for (std::string ln; std::getline(in, ln);) {
    if (ln.empty() || ln[0] == '#') continue;
    size_t t1 = ln.find('\t'), t2 = ln.find('\t', t1 == std::string::npos ? t1 : t1 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos) continue;
    out[ln.substr(0, t1)] = {ln.substr(t1 + 1, t2 - t1 - 1), ln.substr(t2 + 1)};
  }
  return out;
}

std::map<std::string, std::map<std::string, int64_t>> parse_providers(const std::string& s) {
  std::map<std::string, std::map<std::string, int64_t>> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    size_t eq = item.find('='), colon = item.rfind(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq) continue;
    out[item.substr(0, eq)][item.substr(eq + 1, colon - eq - 1)] +=
        std::atoll(item.substr(colon + 1).c_str());
  }
  return out;
}

bool provider_of_device(const std::string& provider, const std::string& device) {
  std::string tier = provider.substr(0, provider.find('.'));
  if (device == "ref") return tier == "ref";
  if (device == "cpu") return tier == "cpu";
  return tier != "ref" && tier != "cpu";  // cuda, cublaslt, cublas, ...
}

}  // namespace arbiter::verify
