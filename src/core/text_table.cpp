#include "core/text_table.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace arbiter {

namespace {

// Columns on screen: one per code point, none for UTF-8 continuation bytes or for combining
// diacritics U+0300..U+036F (lead bytes 0xCC, 0xCD), so "±" and "x̄" are one column each.
size_t cols_of(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 && c != 0xCC && c != 0xCD;
  return n;
}

}  // namespace

TextTable::TextTable(std::vector<Column> columns) : cols_(std::move(columns)), seps_(cols_.size(), " ") {
  if (!seps_.empty()) seps_[0] = "";
}

void TextTable::groups(std::vector<std::pair<std::string, int>> spans) { groups_ = std::move(spans); }

void TextTable::separator_before(size_t col, std::string sep) {
  ARB_ASSERT(col > 0 && col < cols_.size());
  seps_[col] = std::move(sep);
}

void TextTable::row(std::vector<std::string> cells) {
  ARB_ASSERT(cells.size() <= cols_.size());
  cells.resize(cols_.size());
  rows_.push_back(std::move(cells));
}

void TextTable::blank() { rows_.emplace_back(); }

std::vector<size_t> TextTable::cell_widths() const {
  std::vector<size_t> w(cols_.size());
  for (size_t c = 0; c < w.size(); ++c) w[c] = cols_of(cols_[c].header);
  for (const auto& r : rows_)
    for (size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], cols_of(r[c]));
  return w;
}

std::string TextTable::pad(const std::string& s, size_t c, size_t width) const {
  const std::string fill(width - cols_of(s), ' ');
  return cols_[c].align == Left ? s + fill : fill + s;
}

std::string TextTable::markdown() const {
  const std::vector<size_t> w = cell_widths();
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l = "|";
    for (size_t c = 0; c < w.size(); ++c) l += " " + pad(cells[c], c, w[c]) + " |";
    return l + "\n";
  };
  std::vector<std::string> head;
  for (const Column& col : cols_) head.push_back(col.header);
  std::string out = line(head) + "|";
  for (size_t c = 0; c < w.size(); ++c) out += std::string(w[c] + 2, '-') + "|";
  out += "\n";
  for (const auto& r : rows_)
    if (!r.empty()) out += line(r);
  return out;
}

std::string TextTable::str(const std::string& indent) const {
  const size_t n = cols_.size();
  std::vector<size_t> w = cell_widths();
  // A group title wider than its columns widens the span's last column.
  for (size_t g = 0, c = 0; g < groups_.size() && c < n; c += size_t(groups_[g].second), ++g) {
    const size_t last = std::min(n, c + size_t(groups_[g].second)) - 1;
    size_t span = 0;
    for (size_t k = c; k <= last; ++k) span += w[k] + (k > c ? cols_of(seps_[k]) : 0);
    if (cols_of(groups_[g].first) > span) w[last] += cols_of(groups_[g].first) - span;
  }
  auto finish = [&](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return indent + line + "\n";
  };
  auto render = [&](const std::vector<std::string>& cells, bool header) {
    std::string line;
    for (size_t c = 0; c < n; ++c) {
      line += seps_[c] + pad(header ? cols_[c].header : cells[c], c, w[c]);
    }
    return finish(line);
  };
  std::string out;
  if (!groups_.empty()) {
    std::string line;
    for (size_t g = 0, c = 0; g < groups_.size() && c < n; c += size_t(groups_[g].second), ++g) {
      const size_t last = std::min(n, c + size_t(groups_[g].second)) - 1;
      size_t span = 0;
      for (size_t k = c; k <= last; ++k) span += w[k] + (k > c ? cols_of(seps_[k]) : 0);
      line += seps_[c] + groups_[g].first + std::string(span - cols_of(groups_[g].first), ' ');
    }
    out += finish(line);
  }
  out += render({}, true);
  for (const auto& r : rows_) out += r.empty() ? "\n" : render(r, false);
  return out;
}

std::string fmt_num(const char* fmt, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strformat(fmt, v);
}

}  // namespace arbiter
