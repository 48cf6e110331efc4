// Text tables for the human reports (drift, opcheck, compare, bench, gate): columns as wide
// as their widest cell, so a long stage or side name widens its column instead of being cut
// or misaligning the rows (the reports used printf widths into fixed buffers before).
//
//   TextTable t({{"layer", TextTable::Left}, {"rel_l2"}, {"max_abs"}});
//   t.separator_before(1, " | ");
//   t.row({"0", fmt_num("%.3g", 1e-3), fmt_num("%.3g", 2e-3)});
//   out += t.str("  ");
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace arbiter {

class TextTable {
 public:
  enum Align { Left, Right };
  struct Column {
    std::string header;
    Align align = Right;
  };
  explicit TextTable(std::vector<Column> columns);

  /// A title line above the column headers: each (title, n) spans the next n columns.
  void groups(std::vector<std::pair<std::string, int>> spans);
  /// The text between column col - 1 and col (default one space).
  void separator_before(size_t col, std::string sep);
  /// One row; fewer cells than columns leave the rest empty, more is an internal error.
  void row(std::vector<std::string> cells);
  /// An empty line between rows (a break between groups of rows).
  void blank();
  /// Header line(s) and rows, each line prefixed by indent, trailing blanks trimmed, '\n' ended.
  std::string str(const std::string& indent = "") const;
  /// The same as a Markdown table ("| a | b |", a "|---|" rule under the header), cells padded
  /// to their column's width; separators, groups and blank lines are not drawn.
  std::string markdown() const;

 private:
  std::vector<size_t> cell_widths() const;  // per column, before group titles widen any
  std::string pad(const std::string& s, size_t col, size_t width) const;
  std::vector<Column> cols_;
  std::vector<std::string> seps_;
  std::vector<std::pair<std::string, int>> groups_;
  std::vector<std::vector<std::string>> rows_;  // an empty vector is a blank line
};

/// One number in printf format fmt ("%.3g", "%8.6f"); "nan", "inf" or "-inf" when not finite.
std::string fmt_num(const char* fmt, double v);

}  // namespace arbiter
