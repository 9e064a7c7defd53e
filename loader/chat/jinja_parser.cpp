// Jinja parser: tokens -> syntax tree, recursive descent with Jinja2's precedence
// (jinja2/parser.py): conditional < or < and < not < comparison (incl. in / not in)
// < + - < ~ < * / // % < ** < unary - + < primary with postfix . [] () and then filters
// `|` and tests `is`. Statements: if/elif/else, for (tuple targets, `if` filter, else),
// set (name, tuple, namespace attribute, block), macro, break/continue, generation.
// Anything else is an error naming the line and the construct.
// Nesting is bounded (kMaxNestingDepth) both in the parser's own recursion and in the
// height of each expression tree, which left-associative chains (`a + a + ...`,
// `x.a.a...`) grow without recursing, so that neither parsing, evaluating nor freeing a
// template can overflow the stack.
#include <algorithm>
#include <set>

#include "common/error.h"
#include "loader/chat/jinja.h"

namespace linnet::jinja {
namespace {

using ExprPtr = std::unique_ptr<Expr>;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : t_(tokens), name_(name) {}

  std::vector<Node> parse_template() {
    std::vector<Node> nodes = parse_body({});
    if (peek().kind != Token::Kind::kEnd) fail("unexpected '{% " + block_word() + " %}'");
    return nodes;
  }

 private:
  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* word, std::size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == word;
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(what, peek().line); }
  [[noreturn]] void fail_nesting(int line) const {
    fail_at("the template nests deeper than " + std::to_string(kMaxNestingDepth) +
                " levels (parentheses, brackets, operators and blocks together)",
            line);
  }

  // One level of the parser's recursion (a block, a nested expression) for its lifetime.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (p_.depth_ >= kMaxNestingDepth) p_.fail_nesting(p_.peek().line);
      ++p_.depth_;
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // `e` with its height set from its children's, refused past kMaxNestingDepth. Every node
  // with children goes through here once they are attached.
  ExprPtr sealed(ExprPtr e) const {
    int below = 0;
    for (const auto& a : e->args) {
      if (a) below = std::max(below, a->height);
    }
    for (const auto& kv : e->kwargs) {
      if (kv.second) below = std::max(below, kv.second->height);
    }
    e->height = below + 1;
    if (e->height > kMaxNestingDepth) fail_nesting(e->line);
    return e;
  }
  [[noreturn]] void fail_at(const std::string& what, int line) const {
    throw Error(what, name_ + " line " + std::to_string(line));
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Token::Kind::kEnd: return "end of template";
      case Token::Kind::kBlockEnd: return "'%}'";
      case Token::Kind::kVarEnd: return "'}}'";
      case Token::Kind::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("syntax error: expected '") + op + "', got " + describe(peek()));
    ++i_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail("syntax error: expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != Token::Kind::kBlockEnd) fail("syntax error: expected '%}', got " + describe(peek()));
    ++i_;
  }
  // The statement word after a '{%' at the current position (for messages).
  std::string block_word() const {
    return peek().kind == Token::Kind::kBlockBegin && peek(1).kind == Token::Kind::kName ? peek(1).text : "";
  }

  // Statements until one of `stop` words opens a block; leaves the position at that '{%'.
  std::vector<Node> parse_body(const std::set<std::string>& stop) {
    std::vector<Node> nodes;
    for (;;) {
      const Token& tok = peek();
      if (tok.kind == Token::Kind::kEnd) {
        if (!stop.empty()) fail("syntax error: missing '{% " + *stop.rbegin() + " %}' before the end of the template");
        return nodes;
      }
      if (tok.kind == Token::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.line = tok.line;
        n.text = tok.text;
        nodes.push_back(std::move(n));
        ++i_;
      } else if (tok.kind == Token::Kind::kVarBegin) {
        ++i_;
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = tok.line;
        n.expr = parse_tuple_or_expr();
        if (peek().kind != Token::Kind::kVarEnd) fail("syntax error: expected '}}', got " + describe(peek()));
        ++i_;
        nodes.push_back(std::move(n));
      } else if (tok.kind == Token::Kind::kBlockBegin) {
        const std::string word = block_word();
        if (stop.count(word)) return nodes;
        nodes.push_back(parse_statement());
      } else {
        fail("syntax error: unexpected " + describe(tok));
      }
    }
  }

  Node parse_statement() {
    const Nest nest(*this);
    const int line = next().line;  // '{%'
    if (peek().kind != Token::Kind::kName) fail("syntax error: expected a statement after '{%'");
    const std::string word = next().text;
    Node n;
    n.line = line;
    if (word == "if") {
      n.kind = Node::Kind::kIf;
      ExprPtr cond = parse_expr();
      expect_block_end();
      for (;;) {
        std::vector<Node> body = parse_body({"elif", "else", "endif"});
        n.branches.emplace_back(std::move(cond), std::move(body));
        ++i_;
        const std::string w = next().text;
        if (w == "elif") {
          cond = parse_expr();
          expect_block_end();
          continue;
        }
        expect_block_end();
        if (w == "else") {
          n.else_body = parse_body({"endif"});
          i_ += 2;
          expect_block_end();
        }
        break;
      }
    } else if (word == "for") {
      n.kind = Node::Kind::kFor;
      n.targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        n.targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("syntax error: expected 'in' in the for statement, got " + describe(peek()));
      ++i_;
      n.expr = parse_expr(/*no_cond=*/true);
      if (is_name("if")) {
        ++i_;
        n.condition = parse_expr();
      }
      if (is_name("recursive")) fail("unsupported Jinja construct 'for ... recursive'");
      expect_block_end();
      n.body = parse_body({"else", "endfor"});
      ++i_;
      if (next().text == "else") {
        expect_block_end();
        n.else_body = parse_body({"endfor"});
        i_ += 2;
      }
      expect_block_end();
    } else if (word == "set") {
      n.targets.push_back(expect_name());
      if (is_op(".")) {
        ++i_;
        n.attr = expect_name();
      }
      while (is_op(",")) {
        ++i_;
        n.targets.push_back(expect_name());
      }
      if (is_op("=")) {
        ++i_;
        n.kind = Node::Kind::kSet;
        n.expr = parse_tuple_or_expr();
        expect_block_end();
      } else {
        if (n.targets.size() != 1 || !n.attr.empty()) fail("syntax error: expected '=' in the set statement");
        if (is_op("|")) fail("unsupported Jinja construct 'set with a filter block'");
        n.kind = Node::Kind::kSetBlock;
        expect_block_end();
        n.body = parse_body({"endset"});
        i_ += 2;
        expect_block_end();
      }
    } else if (word == "macro") {
      n.kind = Node::Kind::kMacro;
      n.targets.push_back(expect_name());
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++i_;
          def = parse_expr();
        }
        n.params.emplace_back(std::move(param), std::move(def));
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op(")");
      expect_block_end();
      n.body = parse_body({"endmacro"});
      i_ += 2;
      expect_block_end();
    } else if (word == "break" || word == "continue") {
      n.kind = word == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else if (word == "generation") {
      // transformers' AssistantTracker tag: renders its body unchanged.
      n.kind = Node::Kind::kBlock;
      expect_block_end();
      n.body = parse_body({"endgeneration"});
      i_ += 2;
      expect_block_end();
    } else {
      static const std::set<std::string> kKnown = {"block",  "extends", "include", "import", "from", "call",
                                                   "filter", "with",    "raw",     "autoescape", "do"};
      if (kKnown.count(word)) fail_at("unsupported Jinja construct '{% " + word + " %}'", line);
      fail_at("unsupported Jinja construct: unknown statement '{% " + word + " %}'", line);
    }
    return n;
  }

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // An expression, or a bare tuple `a, b` (as in `{% set x = 1, 2 %}`).
  ExprPtr parse_tuple_or_expr() {
    ExprPtr first = parse_expr();
    if (!is_op(",")) return first;
    ExprPtr tuple = make(Expr::Kind::kTuple, first->line);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (peek().kind == Token::Kind::kBlockEnd || peek().kind == Token::Kind::kVarEnd) break;
      tuple->args.push_back(parse_expr());
    }
    return sealed(std::move(tuple));
  }

  ExprPtr parse_expr(bool no_cond = false) {
    const Nest nest(*this);
    ExprPtr e = parse_or();
    if (no_cond) return e;
    while (is_name("if")) {
      const int line = next().line;
      ExprPtr c = make(Expr::Kind::kCondExpr, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        ++i_;
        other = parse_expr();
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = sealed(std::move(c));
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr a, ExprPtr b, int line, std::string op = {}) {
    ExprPtr e = make(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return sealed(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = binary(Expr::Kind::kOr, std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = binary(Expr::Kind::kAnd, std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this);
      const int line = next().line;
      ExprPtr e = make(Expr::Kind::kNot, line);
      e->args.push_back(parse_not());
      return sealed(std::move(e));
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (peek().kind == Token::Kind::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, first->line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? sealed(std::move(cmp)) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_concat(), op.line, op.text);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary(Expr::Kind::kBinary, std::move(e), parse_math2(), line, "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_pow(), op.line, op.text);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary(Expr::Kind::kBinary, std::move(e), parse_unary(true), line, "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this);
      const Token& op = next();
      e = make(op.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.line);
      e->args.push_back(parse_unary(false));
      e = sealed(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = next();
    switch (tok.kind) {
      case Token::Kind::kName: {
        if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
          ExprPtr e = make(Expr::Kind::kLiteral, tok.line);
          e->literal = Value::boolean(tok.text == "true" || tok.text == "True");
          return e;
        }
        if (tok.text == "none" || tok.text == "None") {
          ExprPtr e = make(Expr::Kind::kLiteral, tok.line);
          e->literal = Value::none();
          return e;
        }
        ExprPtr e = make(Expr::Kind::kName, tok.line);
        e->name = tok.text;
        return e;
      }
      case Token::Kind::kString: {
        std::string s = tok.text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals join
        ExprPtr e = make(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        ExprPtr e = make(Expr::Kind::kLiteral, tok.line);
        e->literal = tok.kind == Token::Kind::kInt ? Value::integer(tok.i) : Value::real(tok.f);
        return e;
      }
      case Token::Kind::kOp:
        if (tok.text == "(") {
          if (is_op(")")) {
            ++i_;
            return make(Expr::Kind::kTuple, tok.line);
          }
          ExprPtr first = parse_expr();
          if (is_op(")")) {
            ++i_;
            return first;
          }
          ExprPtr tuple = make(Expr::Kind::kTuple, tok.line);
          tuple->args.push_back(std::move(first));
          while (is_op(",")) {
            ++i_;
            if (is_op(")")) break;
            tuple->args.push_back(parse_expr());
          }
          expect_op(")");
          return sealed(std::move(tuple));
        }
        if (tok.text == "[") {
          ExprPtr list = make(Expr::Kind::kList, tok.line);
          while (!is_op("]")) {
            list->args.push_back(parse_expr());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("]");
          return sealed(std::move(list));
        }
        if (tok.text == "{") {
          ExprPtr dict = make(Expr::Kind::kDict, tok.line);
          while (!is_op("}")) {
            dict->args.push_back(parse_expr());  // key
            expect_op(":");
            dict->args.push_back(parse_expr());  // value
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("}");
          return sealed(std::move(dict));
        }
        break;
      default: break;
    }
    fail_at("syntax error: unexpected " + describe(tok) + " in an expression", tok.line);
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("unsupported Jinja construct '*args / **kwargs in a call'");
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string key = next().text;
        ++i_;
        call.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        call.args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        const int line = next().line;
        ExprPtr g = make(Expr::Kind::kGetAttr, line);
        if (peek().kind == Token::Kind::kInt) {
          g->kind = Expr::Kind::kGetItem;
          ExprPtr idx = make(Expr::Kind::kLiteral, line);
          idx->literal = Value::integer(next().i);
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(idx));
        } else {
          g->name = expect_name();
          g->args.push_back(std::move(e));
        }
        e = sealed(std::move(g));
      } else if (is_op("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && is_op(":")) {
            ++i_;
            slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        ExprPtr g = make(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
        g->args.push_back(std::move(e));
        if (!slice && !parts[0]) fail_at("syntax error: empty subscript '[]'", line);
        for (int k = 0; k < (slice ? 3 : 1); ++k) g->args.push_back(std::move(parts[k]));
        e = sealed(std::move(g));
      } else if (is_op("(")) {
        ExprPtr c = make(Expr::Kind::kCall, peek().line);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = sealed(std::move(c));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        const int line = next().line;
        ExprPtr f = make(Expr::Kind::kFilter, line);
        f->name = expect_name();
        while (is_op(".")) {
          ++i_;
          f->name += '.';
          f->name += expect_name();
        }
        if (!has_filter(f->name)) fail_at("unsupported Jinja construct: filter '" + f->name + "'", line);
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = sealed(std::move(f));
      } else if (is_name("is")) {
        const int line = next().line;
        ExprPtr t = make(Expr::Kind::kTest, line);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        if (!has_test(t->name)) fail_at("unsupported Jinja construct: test '" + t->name + "'", line);
        t->args.push_back(std::move(e));
        const Token& a = peek();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((a.kind == Token::Kind::kString || a.kind == Token::Kind::kInt || a.kind == Token::Kind::kFloat ||
                    is_op("[") || is_op("{") ||
                    (a.kind == Token::Kind::kName && a.text != "else" && a.text != "or" && a.text != "and" &&
                     a.text != "if" && a.text != "in" && a.text != "not" && a.text != "is"))) {
          ExprPtr arg = parse_primary();
          t->args.push_back(parse_postfix(std::move(arg)));
        }
        e = sealed(std::move(t));
      } else if (is_op("(")) {
        ExprPtr c = make(Expr::Kind::kCall, peek().line);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = sealed(std::move(c));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  std::size_t i_ = 0;
  int depth_ = 0;  // blocks and nested expressions being parsed, against kMaxNestingDepth
};

}  // namespace

std::vector<Node> parse(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).parse_template();
}

}  // namespace linnet::jinja
