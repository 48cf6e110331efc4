// core/text_table.h: columns as wide as their widest cell, alignment, separators, group
// titles, UTF-8 cells counted in screen columns. Add a case: build a table, write the
// expected text by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "core/text_table.h"

using namespace arbiter;

TEST(TextTable, ColumnsWidenToTheirWidestCell) {
  TextTable t({{"name", TextTable::Left}, {"n"}, {"note", TextTable::Left}});
  t.separator_before(2, "  ");
  t.row({"a", "1", "x"});
  t.row({"a-much-longer-name", "12345", ""});  // trailing blanks are trimmed
  EXPECT_EQ(t.str("> "),
            "> name                   n  note\n"
            "> a                      1  x\n"
            "> a-much-longer-name 12345\n");
}

TEST(TextTable, GroupTitlesSpanTheirColumnsAndBlankLinesSeparateRows) {
  TextTable t({{"l", TextTable::Left}, {"a"}, {"b"}});
  t.groups({{"", 1}, {"a wide group title", 2}});
  t.separator_before(1, " | ");
  t.row({"0", "1", "2"});
  t.blank();
  t.row({"1", "3", "4"});
  // The title (18 columns) is wider than "a b" (3): the span's last column takes the rest.
  // b's column: 18 - 1 ("a") - 1 (separator) = 16 wide, right-aligned.
  const std::string gap(16, ' ');
  EXPECT_EQ(t.str(), "  | a wide group title\n"
                     "l | a" + gap + "b\n"
                     "0 | 1" + gap + "2\n"
                     "\n"
                     "1 | 3" + gap + "4\n");
}

TEST(TextTable, Utf8CellsCountScreenColumns) {
  TextTable t({{"v"}, {"u", TextTable::Left}});
  t.row({"1.5 ± 0.2", "x̄"});
  t.row({"3", "ab"});
  EXPECT_EQ(t.str(),
            "        v u\n"
            "1.5 ± 0.2 x̄\n"
            "        3 ab\n");
}

TEST(TextTable, FormatsNonFiniteNumbersAsWords) {
  EXPECT_EQ(fmt_num("%.3g", 0.000123456), "0.000123");
  EXPECT_EQ(fmt_num("%8.4f", 1.5), "  1.5000");
  EXPECT_EQ(fmt_num("%.3g", std::nan("")), "nan");
  EXPECT_EQ(fmt_num("%.3g", -INFINITY), "-inf");
}

TEST(TextTable, MarkdownPadsCellsToTheirColumn) {
  TextTable t({{"test", TextTable::Left}, {"mean ± sd"}});
  t.row({"pp512", "1.50 ± 0.20 t/s"});
  t.row({"trace w8ctx1536", "-"});
  // Column widths 15 and 15 (the ± is one column); a rule of width + 2 dashes per column.
  EXPECT_EQ(t.markdown(),
            "| test            |       mean ± sd |\n"
            "|-----------------|-----------------|\n"
            "| pp512           | 1.50 ± 0.20 t/s |\n"
            "| trace w8ctx1536 |               - |\n");
}
