#include "verify/matrix/matrix_doc.h"

#include <cctype>

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
td.v-pass{background:#dff3df!important;font-weight:600}
td.v-fail{background:#f8d7d7!important;font-weight:600}
td.v-skip,td.v-missing,td.v-inconclusive{background:#fff3cd!important;font-weight:600}
td.v-incomparable,td.v-unreadable,td.v-error{background:#e8d4f0!important;font-weight:600}
figure{margin:1em 0}
figcaption{font-size:.9em;color:#555}
svg{max-width:100%;height:auto}
)";

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
  return o;
}

// CSS class of a verdict-like cell ("PASS", "FAIL (3 decided)", "SKIP: no GPU", ...).
std::string cell_class(const std::string& s) {
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
  std::string o;
  bool code = false, bold = false, em = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      o += code ? "</code>" : "<code>";
      code = !code;
    } else if (!code && s.compare(i, 2, "**") == 0) {
      o += bold ? "</strong>" : "<strong>";
      bold = !bold;
      ++i;
    } else if (!code && s[i] == '*') {
      o += em ? "</em>" : "<em>";
      em = !em;
    } else {
      o += svg_escape(std::string(1, s[i]));
    }
  }
  if (code) o += "</code>";
  if (bold) o += "</strong>";
  if (em) o += "</em>";
  return o;
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

void Doc::table(std::vector<std::vector<std::string>> rows, const std::string& id) {
  DocBlock b;
  b.kind = DocBlock::Kind::Table;
  b.rows = std::move(rows);
  b.id = id;
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
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  svg_escape(title) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n";
  auto id_attr = [](const std::string& id) {
    return id.empty() ? std::string() : " id=\"" + svg_escape(id) + "\"";
  };
  for (const DocBlock& b : blocks_) {
    switch (b.kind) {
      case DocBlock::Kind::Heading: {
        std::string h = "h" + std::to_string(b.level);
        o += "<" + h + id_attr(b.id) + ">" + doc_inline_html(b.text) + "</" + h + ">\n";
        break;
      }
      case DocBlock::Kind::Para:
        o += "<p>" + doc_inline_html(b.text) + "</p>\n";
        break;
      case DocBlock::Kind::List:
        o += "<ul>\n";
        for (const auto& it : b.items) o += "<li>" + doc_inline_html(it) + "</li>\n";
        o += "</ul>\n";
        break;
      case DocBlock::Kind::Table:
        if (b.rows.empty()) break;
        o += "<table" + id_attr(b.id) + ">\n<thead><tr>";
        for (const auto& c : b.rows[0]) o += "<th>" + doc_inline_html(c) + "</th>";
        o += "</tr></thead>\n<tbody>\n";
        for (size_t r = 1; r < b.rows.size(); ++r) {
          o += "<tr>";
          for (const auto& c : b.rows[r]) {
            std::string cls = cell_class(c);
            o += (cls.empty() ? "<td>" : "<td class=\"" + cls + "\">") + doc_inline_html(c) +
                 "</td>";
          }
          o += "</tr>\n";
        }
        o += "</tbody>\n</table>\n";
        break;
      case DocBlock::Kind::Figure:
        o += "<figure" + id_attr(b.id) + ">\n" + b.svg + "<figcaption>" + doc_inline_html(b.text) +
             "</figcaption>\n</figure>\n";
        break;
    }
  }
  return o + "</body>\n</html>\n";
}

}  // namespace arbiter::verify
