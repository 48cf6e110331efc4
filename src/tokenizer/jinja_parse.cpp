// Lexer and parser of the Jinja subset (tokenizer/jinja.h). Whitespace rules are those of
// HF transformers' environment: trim_blocks (the newline after a block or comment tag is
// dropped) and lstrip_blocks (spaces and tabs from the start of a line up to a block or
// comment tag are dropped), plus '-' (strip all whitespace on that side) and '+' (keep it).
// The expression grammar follows jinja2's parser: or < and < not < compare < + - < ~ <
// * / // % < ** < unary, with filters, tests and calls binding tighter than any operator.
//
// The tree's height is bounded while it is built (kMaxNesting, jinja.h): every recursion that
// opens a level (a nested statement or body, a bracket, a prefix operator) and every link of a
// left-associative chain (`1+1+1`, `a.b.c`, `x|f|g`, `f()()`, `a if b else c if d`), which
// grows the tree without recursing here, counts one level while its operand is parsed. A
// node's height is at most the count reached under it plus a few levels, so no deep tree is
// ever made.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <initializer_list>
#include <optional>

#include "tokenizer/jinja_ast.h"

namespace arbiter::jinja {
namespace {

enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, End };

struct Tok {
  T type;
  std::string s;
  int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Tok> run() {
    size_t p = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    bool trim_next = false;   // ... or was a block/comment tag (trim_blocks)
    while (p < src_.size()) {
      size_t tag = find_tag(p);
      std::string text = src_.substr(p, tag - p);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      } else if (trim_next) {
        if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
        else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
      }
      strip_next = trim_next = false;
      if (tag == src_.size()) {
        emit_text(text);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char mod = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{' && at_line_start(tag)) {
        while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.pop_back();
      }
      emit_text(text);
      line_ += count_lines(p, tag);
      p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      bool end_strip = false;
      if (kind == '#') {
        size_t e = src_.find("#}", p);
        if (e == std::string::npos) fail("unclosed comment");
        end_strip = e > p && src_[e - 1] == '-';
        line_ += count_lines(p, e);
        p = e + 2;
      } else {
        out_.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, "", line_});
        p = lex_tag(p, kind == '{' ? '}' : '%', end_strip);
      }
      strip_next = end_strip;
      trim_next = kind != '{' && !(p >= 3 && src_[p - 3] == '+');
    }
    out_.push_back({T::End, "", line_});
    return std::move(out_);
  }

 private:
  const std::string& src_;
  const std::string& name_;
  std::vector<Tok> out_;
  int line_ = 1;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(strformat("[jinja] %s:%d: %s", name_.c_str(), line_, what.c_str()));
  }

  int count_lines(size_t from, size_t to) const {
    int n = 0;
    for (size_t k = from; k < to && k < src_.size(); ++k) n += src_[k] == '\n';
    return n;
  }

  size_t find_tag(size_t p) const {
    for (size_t k = p; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  bool at_line_start(size_t tag) const {
    size_t k = tag;
    while (k > 0 && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
    return k == 0 || src_[k - 1] == '\n';
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) out_.push_back({T::Text, text, line_});
  }

  // Tokens of one {{ }} or {% %} tag from p; returns the position after its closer.
  size_t lex_tag(size_t p, char closer, bool& end_strip) {
    int depth = 0;  // brackets open inside the tag: '}}' closes only at depth 0
    while (true) {
      while (p < src_.size() && is_space(src_[p])) line_ += src_[p++] == '\n';
      if (p >= src_.size()) fail("unclosed tag");
      const char c = src_[p];
      auto closes_at = [&](size_t q) {
        return q + 1 < src_.size() && src_[q] == closer && src_[q + 1] == '}' && depth == 0;
      };
      if ((c == '-' || c == '+') && closes_at(p + 1)) {
        end_strip = c == '-';
        out_.push_back({closer == '}' ? T::VarEnd : T::BlockEnd, "", line_});
        return p + 3;
      }
      if (closes_at(p)) {
        out_.push_back({closer == '}' ? T::VarEnd : T::BlockEnd, "", line_});
        return p + 2;
      }
      if (std::isalpha((unsigned char)c) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum((unsigned char)src_[e]) || src_[e] == '_')) ++e;
        out_.push_back({T::Name, src_.substr(p, e - p), line_});
        p = e;
      } else if (std::isdigit((unsigned char)c)) {
        size_t e = p;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit((unsigned char)src_[e]) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit((unsigned char)src_[e + 1])) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit((unsigned char)src_[e])) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && std::isdigit((unsigned char)src_[f])) {
            is_float = true;
            e = f;
            while (e < src_.size() && std::isdigit((unsigned char)src_[e])) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (src_[k] != '_') num += src_[k];
        out_.push_back({is_float ? T::Float : T::Int, num, line_});
        p = e;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.size() == 1 && !std::strchr("+-*/%~<>=()[]{},.:|", c))
          fail(std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        out_.push_back({T::Op, op, line_});
        p += op.size();
      }
    }
  }

  // A quoted literal with Python's escapes (jinja2 decodes them as "unicode-escape").
  size_t lex_string(size_t p) {
    const char q = src_[p++];
    std::string s;
    const int line0 = line_;
    while (true) {
      if (p >= src_.size()) fail("unterminated string literal");
      char c = src_[p++];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (p >= src_.size()) fail("unterminated string literal");
      char e = src_[p++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case '0': s += '\0'; break;
        case 'a': s += '\a'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'v': s += '\v'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case '\n': ++line_; break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = p + k < src_.size() ? src_[p + k] : 0;
            if (!std::isxdigit((unsigned char)h)) fail("truncated \\" + std::string(1, e) + " escape");
            cp = cp * 16 + uint32_t(std::isdigit((unsigned char)h) ? h - '0' : std::tolower((unsigned char)h) - 'a' + 10);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character in \\U escape");
          p += n;
          append_utf8(s, cp);
          break;
        }
        default: s += '\\'; s += e;  // Python keeps unknown escapes as written
      }
    }
    out_.push_back({T::Str, s, line0});
    return p;
  }

  static void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18));
      s += char(0x80 | ((cp >> 12) & 0x3F));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    }
  }
};

using NodeP = std::unique_ptr<Node>;

class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}

  NodeP parse_all() {
    std::string end;
    NodeP body = parse_body({}, end);
    return body;
  }

 private:
  std::vector<Tok> t_;
  size_t i_ = 0;
  const std::string& name_;
  int depth_ = 0;  // tree levels open (the file comment says how they are counted)

  // Opens one level on construction and one more per deeper(); gives all back when the
  // function that holds it returns.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p), saved_(p.depth_) { deeper(); }
    ~Nest() { p_.depth_ = saved_; }
    void deeper() {
      if (++p_.depth_ > kMaxNesting) p_.fail("nesting deeper than " + std::to_string(kMaxNesting));
    }

   private:
    Parser& p_;
    int saved_;
  };

  const Tok& cur() const { return t_[i_]; }
  const Tok& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(strformat("[jinja] %s:%d: %s", name_.c_str(), cur().line, what.c_str()));
  }
  bool is_op(const char* op) const { return cur().type == T::Op && cur().s == op; }
  bool is_name(const char* n) const { return cur().type == T::Name && cur().s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "'" + got());
    ++i_;
  }
  std::string got() const {
    switch (cur().type) {
      case T::End: return ", got end of template";
      case T::BlockEnd: return ", got end of tag";
      case T::VarEnd: return ", got '}}'";
      default: return ", got '" + cur().s + "'";
    }
  }
  std::string expect_name() {
    if (cur().type != T::Name) fail("expected a name" + got());
    return t_[i_++].s;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd) fail("expected end of tag" + got());
    ++i_;
  }
  // A decimal literal; Python would make a bigint of a longer one, this subset refuses it.
  int64_t parse_int(const std::string& digits) const {
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) fail("integer overflow: literal " + digits.substr(0, 40) + " is out of the int64 range");
    return v;
  }

  NodeP node(Node::Kind k) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = cur().line;
    return n;
  }

  // Statements until one of the end keywords (the keyword is left in `end`, its tag's
  // name consumed); with no end keywords, until the end of the template.
  NodeP parse_body(const std::vector<std::string>& ends, std::string& end) {
    Nest nest(*this);
    NodeP block = node(Node::Kind::Block);
    while (true) {
      const Tok& tk = cur();
      if (tk.type == T::End) {
        if (!ends.empty()) fail("missing '{% " + ends[0] + " %}'");
        return block;
      }
      if (tk.type == T::Text) {
        NodeP n = node(Node::Kind::Text);
        n->name = tk.s;
        block->a.push_back(std::move(n));
        ++i_;
      } else if (tk.type == T::VarBegin) {
        ++i_;
        NodeP n = node(Node::Kind::Output);
        n->a.push_back(parse_expr());
        if (cur().type != T::VarEnd) fail("expected '}}'" + got());
        ++i_;
        block->a.push_back(std::move(n));
      } else if (tk.type == T::BlockBegin) {
        ++i_;
        const std::string kw = expect_name();
        for (const auto& e : ends)
          if (kw == e) {
            end = kw;
            return block;
          }
        block->a.push_back(parse_statement(kw));
      } else {
        fail("unexpected token");
      }
    }
  }

  NodeP parse_statement(const std::string& kw) {
    Nest nest(*this);
    if (kw == "if") return parse_if();
    if (kw == "for") return parse_for();
    if (kw == "set") return parse_set();
    if (kw == "macro") return parse_macro();
    if (kw == "break" || kw == "continue") {
      NodeP n = node(kw == "break" ? Node::Kind::Break : Node::Kind::Continue);
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body
      expect_block_end();
      std::string end;
      NodeP body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return body;
    }
    fail("unsupported tag '" + kw + "'");
  }

  NodeP parse_if() {
    NodeP n = node(Node::Kind::If);
    n->a.push_back(parse_expr());
    expect_block_end();
    while (true) {
      std::string end;
      n->b.push_back(parse_body({"elif", "else", "endif"}, end));
      if (end == "elif") {
        n->a.push_back(parse_expr());
        expect_block_end();
      } else if (end == "else") {
        expect_block_end();
        n->b.push_back(parse_body({"endif"}, end));
        expect_block_end();
        return n;
      } else {
        expect_block_end();
        return n;
      }
    }
  }

  NodeP parse_for() {
    NodeP n = node(Node::Kind::For);
    n->names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      n->names.push_back(expect_name());
    }
    if (!is_name("in")) fail("expected 'in'" + got());
    ++i_;
    n->a.push_back(parse_expr(false));
    n->a.push_back(nullptr);
    if (is_name("if")) {
      ++i_;
      n->a[1] = parse_expr(false);
    }
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect_block_end();
    std::string end;
    n->b.push_back(parse_body({"else", "endfor"}, end));
    if (end == "else") {
      expect_block_end();
      n->b.push_back(parse_body({"endfor"}, end));
    }
    expect_block_end();
    return n;
  }

  NodeP parse_set() {
    NodeP n = node(Node::Kind::Set);
    n->names.push_back(expect_name());
    if (is_op(".")) {
      ++i_;
      n->name = expect_name();
    } else {
      while (is_op(",")) {
        ++i_;
        n->names.push_back(expect_name());
      }
    }
    if (cur().type == T::BlockEnd && n->name.empty() && n->names.size() == 1) {
      ++i_;
      n->kind = Node::Kind::SetBlock;
      std::string end;
      n->b.push_back(parse_body({"endset"}, end));
      expect_block_end();
      return n;
    }
    expect_op("=");
    n->a.push_back(parse_expr());
    expect_block_end();
    return n;
  }

  NodeP parse_macro() {
    NodeP n = node(Node::Kind::Macro);
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      n->names.push_back(expect_name());
      if (is_op("=")) {
        ++i_;
        n->a.push_back(parse_expr());
      } else {
        n->a.push_back(nullptr);
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    expect_block_end();
    std::string end;
    n->b.push_back(parse_body({"endmacro"}, end));
    expect_block_end();
    return n;
  }

  // ---- expressions ------------------------------------------------------------------

  NodeP bin(const std::string& op, NodeP l, NodeP r) {
    NodeP n = node(Node::Kind::Binary);
    n->name = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
  }

  // with_cond: a conditional expression (x if c else y) is allowed at the top (not in a
  // for loop's iterable or filter, where 'if' belongs to the loop).
  NodeP parse_expr(bool with_cond = true) {
    NodeP e = parse_or();
    std::optional<Nest> nest;
    while (with_cond && is_name("if")) {
      nest ? nest->deeper() : (void)nest.emplace(*this);
      ++i_;
      NodeP c = node(Node::Kind::Cond);
      c->a.push_back(parse_or());
      c->a.insert(c->a.begin() + 1, std::move(e));
      if (is_name("else")) {
        ++i_;
        c->a.push_back(parse_expr());
      } else {
        c->a.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  // One level of left-associative binary operators: `operand` parses each side; an operator
  // is whichever of `ops` the current token is (a word such as "or", or a symbol).
  template <class Operand>
  NodeP left_assoc(std::initializer_list<const char*> ops, Operand operand) {
    NodeP l = operand();
    std::optional<Nest> nest;
    while (const char* op = current_of(ops)) {
      nest ? nest->deeper() : (void)nest.emplace(*this);
      ++i_;
      l = bin(op, std::move(l), operand());
    }
    return l;
  }
  const char* current_of(std::initializer_list<const char*> ops) const {
    for (const char* op : ops)
      if (std::isalpha((unsigned char)op[0]) ? is_name(op) : is_op(op)) return op;
    return nullptr;
  }

  NodeP parse_or() { return left_assoc({"or"}, [&] { return parse_and(); }); }
  NodeP parse_and() { return left_assoc({"and"}, [&] { return parse_not(); }); }

  NodeP parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      NodeP n = node(Node::Kind::Unary);
      ++i_;
      n->name = "not";
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodeP parse_compare() {
    NodeP l = parse_math1();
    std::optional<Nest> nest;
    while (true) {
      std::string op;
      if (cur().type == T::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" ||
                                  cur().s == ">" || cur().s == "<=" || cur().s == ">=")) {
        op = cur().s;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == T::Name && peek().s == "in") {
        op = "notin";
        i_ += 2;
      } else {
        return l;
      }
      nest ? nest->deeper() : (void)nest.emplace(*this);
      l = bin(op, std::move(l), parse_math1());
    }
  }

  NodeP parse_math1() { return left_assoc({"+", "-"}, [&] { return parse_concat(); }); }
  NodeP parse_concat() { return left_assoc({"~"}, [&] { return parse_math2(); }); }
  NodeP parse_math2() {
    return left_assoc({"*", "/", "//", "%"}, [&] { return parse_pow(); });
  }
  NodeP parse_pow() { return left_assoc({"**"}, [&] { return parse_unary(true); }); }

  NodeP parse_unary(bool with_filter) {
    NodeP n;
    std::optional<Nest> nest;
    if (is_op("-") || is_op("+")) {
      nest.emplace(*this);
      n = node(Node::Kind::Unary);
      n->name = t_[i_++].s;
      n->a.push_back(parse_unary(false));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  NodeP parse_primary() {
    const Tok& tk = cur();
    if (tk.type == T::Name) {
      const std::string& s = tk.s;
      NodeP n = node(Node::Kind::Literal);
      if (s == "true" || s == "True") n->value = Value::boolean(true);
      else if (s == "false" || s == "False") n->value = Value::boolean(false);
      else if (s == "none" || s == "None") n->value = Value::none();
      else {
        n->kind = Node::Kind::Name;
        n->name = s;
      }
      ++i_;
      return n;
    }
    if (tk.type == T::Str) {
      NodeP n = node(Node::Kind::Literal);
      std::string s;
      while (cur().type == T::Str) s += t_[i_++].s;  // adjacent literals concatenate
      n->value = Value::string(std::move(s));
      return n;
    }
    if (tk.type == T::Int || tk.type == T::Float) {
      NodeP n = node(Node::Kind::Literal);
      n->value = tk.type == T::Int ? Value::integer(parse_int(tk.s)) : Value::number(std::strtod(tk.s.c_str(), nullptr));
      ++i_;
      return n;
    }
    std::optional<Nest> nest;
    if (is_op("(") || is_op("[") || is_op("{")) nest.emplace(*this);
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        return node(Node::Kind::ListLit);
      }
      NodeP e = parse_expr();
      if (is_op(",")) {  // a tuple
        NodeP l = node(Node::Kind::ListLit);
        l->a.push_back(std::move(e));
        while (is_op(",")) {
          ++i_;
          if (is_op(")")) break;
          l->a.push_back(parse_expr());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      NodeP l = node(Node::Kind::ListLit);
      while (!is_op("]")) {
        l->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++i_;
      NodeP d = node(Node::Kind::DictLit);
      while (!is_op("}")) {
        d->a.push_back(parse_expr());
        expect_op(":");
        d->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return d;
    }
    fail("expected an expression" + got());
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == T::Name && peek().type == T::Op && peek().s == "=") {
        n.kwnames.push_back(t_[i_].s);
        i_ += 2;
        n.kwvalues.push_back(parse_expr());
      } else {
        if (!n.kwnames.empty()) fail("positional argument after a keyword argument");
        n.a.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  NodeP parse_postfix(NodeP n) {
    std::optional<Nest> nest;
    while (true) {
      if (is_op(".") || is_op("[") || is_op("(")) nest ? nest->deeper() : (void)nest.emplace(*this);
      if (is_op(".")) {
        ++i_;
        NodeP g = node(Node::Kind::GetAttr);
        if (cur().type == T::Int) g->name = t_[i_++].s;  // x.0 is x[0] in jinja2
        else g->name = expect_name();
        g->a.push_back(std::move(n));
        n = std::move(g);
      } else if (is_op("[")) {
        ++i_;
        NodeP parts[3];
        int k = 0;
        bool slice = false;
        while (true) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (is_op(":") && k < 2) {
            slice = true;
            ++k;
            ++i_;
            continue;
          }
          break;
        }
        expect_op("]");
        NodeP g = node(slice ? Node::Kind::Slice : Node::Kind::GetItem);
        g->a.push_back(std::move(n));
        if (!slice && !parts[0]) fail("empty subscript");
        for (int q = 0; q < (slice ? 3 : 1); ++q) g->a.push_back(std::move(parts[q]));
        n = std::move(g);
      } else if (is_op("(")) {
        NodeP c = node(Node::Kind::Call);
        c->a.push_back(std::move(n));
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  NodeP parse_filter_expr(NodeP n) {
    std::optional<Nest> nest;
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) nest ? nest->deeper() : (void)nest.emplace(*this);
      if (is_op("|")) {
        ++i_;
        NodeP f = node(Node::Kind::Filter);
        f->name = expect_name();
        f->a.push_back(std::move(n));
        if (is_op("(")) parse_call_args(*f);
        n = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        NodeP t = node(Node::Kind::Test);
        if (is_name("not")) {
          ++i_;
          t->flag = true;
        }
        t->name = expect_name();
        t->a.push_back(std::move(n));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == T::Name || cur().type == T::Str || cur().type == T::Int ||
                    cur().type == T::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if")) {
          // jinja2: `x is divisibleby 3`, `x is sameas false` take one argument unparenthesised
          t->a.push_back(parse_postfix(parse_primary()));
        }
        n = std::move(t);
      } else if (is_op("(")) {
        NodeP c = node(Node::Kind::Call);
        c->a.push_back(std::move(n));
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }
};

}  // namespace

std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name) {
  Lexer lx(source, name);
  Parser p(lx.run(), name);
  return p.parse_all();
}

}  // namespace arbiter::jinja
