// Jinja lexer: template text -> tokens, with Jinja2's whitespace control as transformers
// sets it (trim_blocks: a block or comment tag eats the newline after it; lstrip_blocks:
// spaces and tabs from the start of a line up to a block or comment tag are dropped;
// `-` strips all whitespace on that side, `+` turns the trimming off).
// Mirrors jinja2/lexer.py (Lexer.tokeniter), including its `line_starting` rule.
#include <cctype>
#include <string_view>

#include "common/error.h"
#include "loader/chat/jinja.h"

namespace linnet::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : src_(std::move(source)), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const std::size_t open = find_open(pos_);
      if (open == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      char sign = 0;
      if (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')) sign = src_[open + 2];
      std::string text = src_.substr(pos_, open - pos_);
      if (sign == '-') {
        std::size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        const std::size_t nl = text.rfind('\n');
        const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool blank = true;
          for (std::size_t k = l_pos; k < text.size(); ++k) blank = blank && is_space(text[k]);
          if (blank) text.resize(l_pos);
        }
      }
      emit_text(text, pos_);
      pos_ = open + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        lex_comment(open);
      } else {
        lex_tag(kind == '{', open);
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{Token::Kind::kEnd, "", 0, 0.0, line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::size_t find_open(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  int line_at(std::size_t p) {
    for (; line_pos_ < p && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  [[noreturn]] void fail(const std::string& what, std::size_t p) {
    throw Error(what, name_ + " line " + std::to_string(line_at(p)));
  }

  void emit_text(const std::string& text, std::size_t at) {
    if (!text.empty()) tokens_.push_back(Token{Token::Kind::kText, text, 0, 0.0, line_at(at)});
  }

  // After an end marker: `-` eats all whitespace; plain (blocks and comments) eats one
  // newline (trim_blocks); `+` eats nothing.
  void after_end(char sign, bool trim_newline) {
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (sign != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  void lex_comment(std::size_t open) {
    const std::size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail("syntax error: missing end of comment tag '#}'", open);
    char sign = 0;
    if (close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+')) sign = src_[close - 1];
    pos_ = close + 2;
    after_end(sign, true);
  }

  void lex_tag(bool is_var, std::size_t open) {
    tokens_.push_back(Token{is_var ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", 0, 0.0, line_at(open)});
    const std::string_view end = is_var ? "}}" : "%}";
    int depth = 0;
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) fail(std::string("syntax error: unclosed tag, missing '") + std::string(end) + "'", open);
      const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
      if (depth == 0) {
        char sign = 0;
        if ((rest[0] == '-' || (!is_var && rest[0] == '+')) && rest.substr(1, 2) == end) sign = rest[0];
        if (sign || rest.substr(0, 2) == end) {
          tokens_.push_back(Token{is_var ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", 0, 0.0, line_at(pos_)});
          pos_ += sign ? 3 : 2;
          after_end(sign, !is_var);
          return;
        }
      }
      const int line = line_at(pos_);
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t n = 1;
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        tokens_.push_back(Token{Token::Kind::kName, std::string(rest.substr(0, n)), 0, 0.0, line});
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(rest, line);
      } else if (c == '\'' || c == '"') {
        lex_string(rest, line);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "<",
                                           ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
        std::string op;
        for (const char* o : kOps) {
          if (rest.substr(0, std::string_view(o).size()) == o) {
            op = o;
            break;
          }
        }
        if (op.empty()) fail(std::string("syntax error: unexpected character '") + c + "'", pos_);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        tokens_.push_back(Token{Token::Kind::kOp, op, 0, 0.0, line});
        pos_ += op.size();
      }
    }
  }

  void lex_number(std::string_view rest, int line) {
    std::size_t n = 0;
    std::string digits;
    bool is_float = false;
    const auto take_digits = [&] {
      while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    take_digits();
    if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      digits += '.';
      ++n;
      take_digits();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      std::size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        digits += 'e';
        digits += rest.substr(n + 1, m - n - 1);
        n = m;
        take_digits();
      }
    }
    Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits, 0, 0.0, line};
    try {
      if (is_float) {
        t.f = std::stod(digits);
      } else {
        t.i = std::stoll(digits);
      }
    } catch (const std::exception&) {
      fail("syntax error: number out of range '" + digits + "'", pos_);
    }
    tokens_.push_back(std::move(t));
    pos_ += n;
  }

  // A quoted string with Python's unicode-escape rules (what Jinja2 applies).
  void lex_string(std::string_view rest, int line) {
    const char q = rest[0];
    std::string value;
    std::size_t n = 1;
    for (;; ++n) {
      if (n >= rest.size()) fail("syntax error: unterminated string", pos_);
      const char c = rest[n];
      if (c == q) break;
      if (c != '\\' || n + 1 >= rest.size()) {
        value += c;
        continue;
      }
      const char e = rest[++n];
      const auto hex = [&](std::size_t digits) {
        if (n + digits >= rest.size()) fail("syntax error: truncated \\x / \\u escape in a string", pos_);
        uint32_t cp = 0;
        for (std::size_t k = 1; k <= digits; ++k) {
          const char h = rest[n + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail("syntax error: bad escape in a string", pos_);
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        n += digits;
        value += from_u32(std::u32string(1, static_cast<char32_t>(cp)));
      };
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '0': value += '\0'; break;
        case '\n': break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back(Token{Token::Kind::kString, value, 0, 0.0, line});
    pos_ += n + 1;
  }

  std::string src_;
  const std::string& name_;
  std::size_t pos_ = 0;
  std::size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// Jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) {
  return Lexer(normalize_newlines(source), name).run();
}

}  // namespace linnet::jinja
