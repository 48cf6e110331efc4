// A small document model for the matrix report: headings, paragraphs, lists, tables and
// SVG figures, rendered both as Markdown (figures as links to SVG files) and as one
// self-contained HTML file (inline CSS and SVG, no script, no network). Writing the report
// once as blocks keeps report.md and report.html saying exactly the same thing.
//
// Text is CommonMark (rendered to HTML by Debian's libcmark, raw HTML passed through).
// Table cells starting with PASS/FAIL/SKIP/... (after an optional link bracket and verdict
// glyph, see doc_verdict_glyph) are coloured in HTML.
#pragma once
#include <string>
#include <vector>

namespace arbiter::verify {

struct DocBlock {
  enum class Kind { Heading, Para, List, Table, Figure };
  Kind kind = Kind::Para;
  int level = 1;                               // headings: 1..3
  std::string text;                            // heading, paragraph, figure caption
  std::vector<std::string> items;              // list items
  std::vector<std::vector<std::string>> rows;  // table: rows[0] is the header row
  std::string svg, svg_file;                   // figure: the SVG text and its file (md link)
  std::string id;                              // HTML id (headings, tables, figures)
  std::string css;                             // HTML class (tables)
};

class Doc {
 public:
  void heading(int level, const std::string& text, const std::string& id = "");
  void para(const std::string& text);
  void list(std::vector<std::string> items);
  void table(std::vector<std::vector<std::string>> rows, const std::string& id = "",
             const std::string& css = "");
  void figure(const std::string& caption, const std::string& svg, const std::string& svg_file,
              const std::string& id = "");
  const std::vector<DocBlock>& blocks() const { return blocks_; }

  std::string markdown() const;
  /// A whole HTML5 document titled title.
  std::string html(const std::string& title) const;

 private:
  std::vector<DocBlock> blocks_;
};

/// s (CommonMark) as HTML; a single paragraph without its <p> wrapper.
std::string doc_inline_html(const std::string& s);

/// The glyph that shows a verdict by shape as well as by colour: PASS ✓, FAIL ✗,
/// INCOMPARABLE/UNREADABLE/ERROR !, everything else (SKIP, MISSING, INCONCLUSIVE) ?.
std::string doc_verdict_glyph(const std::string& verdict_upper);

}  // namespace arbiter::verify
