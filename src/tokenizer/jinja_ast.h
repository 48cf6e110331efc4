// The syntax tree shared by the Jinja subset's parser (jinja_parse.cpp) and evaluator
// (jinja_eval.cpp, jinja_library.cpp). Private to tokenizer/.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace arbiter::jinja {

struct Node {
  enum class Kind {
    // expressions
    Literal,   // value
    Name,      // name
    GetAttr,   // a[0].name
    GetItem,   // a[0][a[1]]
    Slice,     // a[0][a[1]:a[2]:a[3]] (null parts allowed)
    Call,      // a[0](a[1..], kw)
    Filter,    // a[0] | name(a[1..], kw)
    Test,      // a[0] is [not: flag] name(a[1..])
    Unary,     // name a[0]: "-", "+", "not"
    Binary,    // a[0] name a[1]: or and + - * / // % ** ~ == != < > <= >= in notin
    Cond,      // a[1] if a[0] else a[2] (a[2] may be null)
    ListLit,   // [a...] and tuples
    DictLit,   // {a[0]: a[1], a[2]: a[3], ...}
    // statements
    Text,      // name: the text
    Output,    // {{ a[0] }}
    If,        // a[i] condition of body b[i]; b[n] (n = a.size()) the else body if present
    For,       // for names in a[0] [if a[1]]: b[0] else b[1]
    Set,       // set names = a[0], or names[0].name = a[0] when name is non-empty
    SetBlock,  // {% set names[0] %} b[0] {% endset %}
    Macro,     // macro name(names = a[i] defaults) b[0]
    Break,
    Continue,
    Block,     // a: statements in order
  };
  Kind kind = Kind::Block;
  int line = 0;
  std::string name;
  std::vector<std::string> names;
  Value value;
  std::vector<std::unique_ptr<Node>> a, b;
  std::vector<std::string> kwnames;          // Call/Filter/Test keyword names ...
  std::vector<std::unique_ptr<Node>> kwvalues;  // ... and their values
  bool flag = false;
};

/// Parses source into a Block; throws Error "[jinja] NAME:LINE: what".
std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name);

}  // namespace arbiter::jinja
