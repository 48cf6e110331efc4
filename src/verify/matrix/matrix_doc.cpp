#include "verify/matrix/matrix_doc.h"

#include <cmark.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "verify/localize/svg.h"

namespace arbiter::verify {

namespace {

const char* kCss = R"(body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px}
body{padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #444}
h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.8em 0;font-size:.86em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
tr:nth-child(even) td{background:#fafafa}
code{background:#f4f4f4;padding:0 3px;border-radius:3px;font-size:.92em}
td.v-pass{background:#d9f0e8!important;box-shadow:inset 4px 0 #009e73;font-weight:600}
td.v-fail{background:#f9e0cf!important;box-shadow:inset 4px 0 #d55e00;font-weight:600}
td.v-skip,td.v-missing,td.v-inconclusive{background:#f4f4f4!important;box-shadow:inset 4px 0 #e69f00}
td.v-incomparable,td.v-unreadable,td.v-error{background:#f5e3ee!important;box-shadow:inset 4px 0 #cc79a7;font-weight:600}
table.grid td{font-weight:400!important;line-height:1.3}
table.grid td a{color:inherit;text-decoration:none;font-weight:700}
figure{margin:1em 0}
figcaption{font-size:.9em;color:#555}
figure svg{width:100%;height:auto}
)";

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
  return o;
}

// CSS class of a verdict-like cell ("PASS", "FAIL (3 decided)", "SKIP: no GPU",
// "[✗ FAIL ...](#anchor)", ...).
std::string cell_class(std::string s) {
  if (!s.empty() && s[0] == '[') s.erase(0, 1);
  for (const char* g : {"✓ ", "✗ ", "! ", "? "})
    if (s.rfind(g, 0) == 0) s.erase(0, std::strlen(g));
  for (const char* v :
       {"PASS", "FAIL", "SKIP", "MISSING", "INCONCLUSIVE", "INCOMPARABLE", "UNREADABLE", "ERROR"}) {
    std::string w = v;
    if (s.compare(0, w.size(), w) == 0 &&
        (s.size() == w.size() || !std::isalpha((unsigned char)s[w.size()]))) {
      std::string c = "v-";
      for (char ch : w) c += char(std::tolower((unsigned char)ch));
      return c;
    }
  }
  return "";
}

}  // namespace

std::string doc_inline_html(const std::string& s) {
  // CommonMark by Debian's libcmark; UNSAFE keeps the raw HTML the report writes itself
  // (SVG, links with ids). A single paragraph loses its <p> so the text fits in a cell.
  char* h = cmark_markdown_to_html(s.data(), s.size(), CMARK_OPT_UNSAFE);
  std::string o = h ? h : "";
  std::free(h);
  while (!o.empty() && o.back() == '\n') o.pop_back();
  if (o.size() >= 7 && o.compare(0, 3, "<p>") == 0 && o.compare(o.size() - 4, 4, "</p>") == 0 &&
      o.find("<p>", 3) == std::string::npos)
    o = o.substr(3, o.size() - 7);
  return o;
}

std::string doc_verdict_glyph(const std::string& v) {
  if (v == "PASS") return "✓";
  if (v == "FAIL") return "✗";
  if (v == "INCOMPARABLE" || v == "UNREADABLE" || v == "ERROR") return "!";
  return "?";
}

void Doc::heading(int level, const std::string& text, const std::string& id) {
  DocBlock b;
  b.kind = DocBlock::Kind::Heading;
  b.level = level;
  b.text = text;
  b.id = id;
  blocks_.push_back(b);
}

void Doc::para(const std::string& text) {
  DocBlock b;
  b.kind = DocBlock::Kind::Para;
  b.text = text;
  blocks_.push_back(b);
}

void Doc::list(std::vector<std::string> items) {
  DocBlock b;
  b.kind = DocBlock::Kind::List;
  b.items = std::move(items);
  blocks_.push_back(b);
}

void Doc::table(std::vector<std::vector<std::string>> rows, const std::string& id,
                const std::string& css) {
  DocBlock b;
  b.kind = DocBlock::Kind::Table;
  b.rows = std::move(rows);
  b.id = id;
  b.css = css;
  blocks_.push_back(b);
}

void Doc::figure(const std::string& caption, const std::string& svg, const std::string& svg_file,
                 const std::string& id) {
  DocBlock b;
  b.kind = DocBlock::Kind::Figure;
  b.text = caption;
  b.svg = svg;
  b.svg_file = svg_file;
  b.id = id;
  blocks_.push_back(b);
}

std::string Doc::markdown() const {
  std::string o;
  for (const DocBlock& b : blocks_) {
    switch (b.kind) {
      case DocBlock::Kind::Heading:
        o += std::string(size_t(b.level), '#') + " " + b.text + "\n\n";
        break;
      case DocBlock::Kind::Para:
        o += b.text + "\n\n";
        break;
      case DocBlock::Kind::List:
        for (const auto& it : b.items) o += "- " + it + "\n";
        o += "\n";
        break;
      case DocBlock::Kind::Table: {
        if (b.rows.empty()) break;
        for (size_t r = 0; r < b.rows.size(); ++r) {
          o += "|";
          for (const auto& c : b.rows[r]) o += " " + md_cell(c) + " |";
          o += "\n";
          if (r == 0) {
            o += "|";
            for (size_t c = 0; c < b.rows[0].size(); ++c) o += "---|";
            o += "\n";
          }
        }
        o += "\n";
        break;
      }
      case DocBlock::Kind::Figure:
        o += "![" + b.text + "](" + b.svg_file + ")\n\n*" + b.text + "*\n\n";
        break;
    }
  }
  return o;
}

std::string Doc::html(const std::string& title) const {
  // One CommonMark document for libcmark: paragraphs and lists as Markdown, the blocks
  // CommonMark has no syntax for (ids, tables, figures) as raw HTML blocks. A raw HTML block
  // ends at a blank line, so none is written inside one.
  auto id_attr = [](const std::string& id) {
    return id.empty() ? std::string() : " id=\"" + svg_escape(id) + "\"";
  };
  auto one_line = [](std::string h) {
    for (char& c : h)
      if (c == '\n') c = ' ';
    return h;
  };
  std::string md;
  for (const DocBlock& b : blocks_) {
    switch (b.kind) {
      case DocBlock::Kind::Heading: {
        std::string h = "h" + std::to_string(b.level);
        md +=
            "<" + h + id_attr(b.id) + ">" + one_line(doc_inline_html(b.text)) + "</" + h + ">\n\n";
        break;
      }
      case DocBlock::Kind::Para:
        md += b.text + "\n\n";
        break;
      case DocBlock::Kind::List:
        for (const auto& it : b.items) md += "- " + it + "\n";
        md += "\n";
        break;
      case DocBlock::Kind::Table:
        if (b.rows.empty()) break;
        md += "<table" + id_attr(b.id) + (b.css.empty() ? "" : " class=\"" + b.css + "\"") +
              ">\n<thead><tr>";
        for (const auto& c : b.rows[0]) md += "<th>" + one_line(doc_inline_html(c)) + "</th>";
        md += "</tr></thead>\n<tbody>\n";
        for (size_t r = 1; r < b.rows.size(); ++r) {
          md += "<tr>";
          for (const auto& c : b.rows[r]) {
            std::string cls = cell_class(c);
            md += (cls.empty() ? "<td>" : "<td class=\"" + cls + "\">") +
                  one_line(doc_inline_html(c)) + "</td>";
          }
          md += "</tr>\n";
        }
        md += "</tbody>\n</table>\n\n";
        break;
      case DocBlock::Kind::Figure: {
        std::string svg = b.svg;
        // An SVG never holds a blank line (render_svg), but keep the block intact regardless.
        for (size_t at; (at = svg.find("\n\n")) != std::string::npos;) svg.erase(at, 1);
        md += "<figure" + id_attr(b.id) + ">\n" + svg + "<figcaption>" +
              one_line(doc_inline_html(b.text)) + "</figcaption>\n</figure>\n\n";
        break;
      }
    }
  }
  char* body = cmark_markdown_to_html(md.data(), md.size(), CMARK_OPT_UNSAFE);
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  svg_escape(title) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n" +
                  (body ? body : "") + "</body>\n</html>\n";
  std::free(body);
  return o;
}

}  // namespace arbiter::verify
