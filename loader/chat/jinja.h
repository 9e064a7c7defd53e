// The Jinja interpreter behind chat templates (internal to loader/): values, tokens, the
// syntax tree, and the three stages lexer -> parser -> evaluator.
//
// Design choice: behave like Python Jinja2 3.1 as transformers configures it
// (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols), with
// Python's value semantics (str() of lists and floats, truthiness, slicing by code point),
// because the product must give byte-identical prompts. Only the subset chat templates
// use is implemented; anything else fails at parse time naming the line and construct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace linnet::jinja {

// --- limits ---------------------------------------------------------------------------
// Bounds that keep a hostile template from exhausting the stack, memory or time of the
// process that renders it. Each is far above what real chat templates need (the largest
// nest ~10 levels, render a few KiB, and take ~10^4 steps for a long conversation).
// Passing one is an Error naming the template and the line, like any template error.

/// Nesting of expressions (parentheses, brackets, operators) and blocks (if / for / macro /
/// set / generation) together at parse time, and of macro calls at render time.
inline constexpr int kMaxNestingDepth = 256;
/// Bytes of one render's output, and of any string built while rendering (`~`, `+`, join,
/// replace, a set block or a macro's output).
inline constexpr std::size_t kMaxOutputBytes = std::size_t{16} << 20;
/// Evaluation steps of one render: loop iterations, items iterated, and calls (macros,
/// filters, methods, globals).
inline constexpr int64_t kMaxSteps = 10'000'000;
/// Bytes of the result of `str * n`.
inline constexpr std::size_t kMaxRepeatBytes = std::size_t{16} << 20;
/// Items of the result of `list * n` and `list + list`.
inline constexpr std::size_t kMaxListItems = std::size_t{1} << 20;
/// Evaluator recursion (statement lists, expressions and macro calls in progress), which
/// bounds the native stack a render uses: a macro nesting kMaxNestingDepth deep may not
/// also recurse kMaxNestingDepth times.
inline constexpr int kMaxEvalDepth = 4 * kMaxNestingDepth;
/// Items of one range().
inline constexpr int64_t kMaxRangeItems = 100'000;
/// Nesting of the values a render builds that str(), tojson and == walk (a loop can nest
/// a list 100000 levels deep; walking it would overflow the stack). Python's walks stop at
/// its recursion limit too (RecursionError).
inline constexpr int kMaxValueDepth = 2 * kMaxNestingDepth;
/// Bytes one render may copy: every string an expression yields (a variable's value is a
/// copy too), the items a loop or filter iterates, list `+` and `*`. With kMaxSteps this
/// bounds time and memory where each step is cheap but its data is large (a loop over
/// a 16 MiB string's `~`); a long conversation copies a few MiB.
inline constexpr std::size_t kMaxCopyBytes = std::size_t{1} << 30;

struct Value;
class Evaluator;

using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python's dict
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(Evaluator&, Args&, Kwargs&, int line)>;

/// A Jinja value with Python semantics. Lists, dicts and namespaces are shared by
/// reference, as Python objects are.
struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };
  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  /// Frees what this value alone holds with a bounded native stack: below a few dozen
  /// nested destructors, the rest is handed to the outermost one, which frees it in a
  /// loop (a list nested 100000 deep, or a chain of dicts held by bound methods, would
  /// otherwise recurse once per level).
  ~Value();

  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                  // kString; for kUndefined the name that was missing
  std::shared_ptr<List> list;     // kList
  std::shared_ptr<Dict> dict;     // kDict, kNamespace
  std::shared_ptr<Function> fn;   // kFunction
  bool tuple = false;             // a kList that Python would show as a tuple

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(List items = {});
  static Value make_dict(Dict items = {});
  static Value make_namespace(Dict items = {});
  static Value function(Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_none() const { return type == Type::kNone; }
  bool is_string() const { return type == Type::kString; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat || type == Type::kBool; }
  bool truthy() const;
  /// The dict entry `key`, or nullptr (kDict and kNamespace).
  const Value* find(const std::string& key) const;
  /// Python's type name, for error messages ("str", "list", "NoneType", ...).
  const char* type_name() const;
};

/// What the value walkers (str / repr, tojson, ==) throw for a value nested deeper than
/// kMaxValueDepth, or whose text would pass kMaxOutputBytes; render() reports it as an
/// Error naming the template and the line being evaluated.
struct ValueLimit : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Python's str(v) (Undefined gives "").
/// @throws ValueLimit as described there.
std::string to_str(const Value& v);
/// Python's repr(v).
/// @throws ValueLimit as described there.
std::string to_repr(const Value& v);
/// Python's repr(float).
std::string float_repr(double d);
/// json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent < 0: none.
/// Returns false for values JSON cannot hold, and when `out` would pass kMaxOutputBytes
/// (then `*too_long` is set, where given; the caller reports it with its line).
/// @throws ValueLimit for a value nested deeper than kMaxValueDepth.
bool to_json(const Value& v, bool ensure_ascii, int indent, const std::string& item_sep, const std::string& key_sep,
             bool sort_keys, std::string& out, bool* too_long = nullptr);
/// Python ==, with Python's identity rule for containers (the same list or dict is
/// equal to itself without comparing items). `ev` (when given) counts every item
/// compared as an evaluation step at `line`.
/// @throws ValueLimit when the values nest deeper than kMaxValueDepth; Error from
///   Evaluator::step.
bool equal(const Value& a, const Value& b, Evaluator* ev = nullptr, int line = 0);

/// The first occurrence of `needle` in `haystack` at or after `from`, or npos; linear
/// time in the lengths (std::string::find compares the needle at every position).
std::size_t find_text(std::string_view haystack, std::string_view needle, std::size_t from = 0);

// --- tokens ---------------------------------------------------------------------------

struct Token {
  enum class Kind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // data, name, operator, or string value
  int64_t i = 0;
  double f = 0.0;
  int line = 1;
};

/// Splits a template into tokens with Jinja2's whitespace rules (trim_blocks,
/// lstrip_blocks, `-` / `+` markers; one trailing newline of the source dropped).
/// @throws Error naming the line on an unclosed tag, comment or string.
std::vector<Token> lex(const std::string& source, const std::string& name);

// --- syntax tree ----------------------------------------------------------------------

struct Expr {
  enum class Kind {
    kLiteral, kName, kList, kTuple, kDict, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest,
    kNeg, kPos, kNot, kAnd, kOr, kBinary, kCompare, kCondExpr
  };
  Kind kind = Kind::kLiteral;
  int line = 1;
  Value literal;                            // kLiteral
  std::string name;                         // kName, attribute, filter, test, binary operator
  std::vector<std::string> ops;             // kCompare: the operators between args
  std::vector<std::unique_ptr<Expr>> args;  // operands; kSlice: obj, start, stop, step (null = absent)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;  // kCall / kFilter / kTest; kDict keys
  bool negated = false;                     // kTest: `is not`
  int height = 1;                           // levels of the tree from here down (<= kMaxNestingDepth)
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kBlock };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;                                                  // kText
  std::unique_ptr<Expr> expr;                                        // output, set value, for iterable
  std::vector<std::pair<std::unique_ptr<Expr>, std::vector<Node>>> branches;  // kIf: if / elif
  std::vector<Node> body;                                            // for, set block, macro, block
  std::vector<Node> else_body;                                       // if, for
  std::vector<std::string> targets;                                  // for / set names; macro name
  std::string attr;                                                  // set ns.attr
  std::unique_ptr<Expr> condition;                                   // for ... if condition
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> params; // macro (default may be null)
};

/// Parses tokens into the node list of a template.
/// @throws Error "unsupported Jinja construct ..." / "syntax error ..." naming `name` and the line,
///   or "the template nests deeper than kMaxNestingDepth levels" (blocks and expressions).
std::vector<Node> parse(const std::vector<Token>& tokens, const std::string& name);

/// True when `filter` / `test` are known to the evaluator (checked at parse time).
bool has_filter(const std::string& filter);
bool has_test(const std::string& test);

// --- evaluation ------------------------------------------------------------------------

/// Walks the syntax tree. Variables live in frames: the first holds the builtins and the
/// caller's variables; each for-loop iteration and macro call pushes its own (Jinja2's
/// scoping: `set` inside a loop body is not seen after the iteration).
class Evaluator {
 public:
  Evaluator(const std::string& name, const Value& globals);

  /// What a statement list ended with.
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const std::vector<Node>& nodes, std::string& out);
  Value eval(const Expr& e);
  Value call(const Value& callee, Args& args, Kwargs& kwargs, int line);

  /// Counts `n` evaluation steps at `line`.
  /// @throws Error "... more than kMaxSteps evaluation steps" naming the line.
  void step(int line, int64_t n = 1);
  /// Counts `bytes` copied at `line`.
  /// @throws Error "... copies more than kMaxCopyBytes bytes" naming the line.
  void copied(std::size_t bytes, int line);
  /// Checks that a string of `bytes` may be built at `line` (`what` names the operation).
  /// @throws Error "... longer than kMaxOutputBytes" naming the line.
  void check_size(std::size_t bytes, int line, const char* what) const;

  /// The line of the expression or statement evaluated last (for errors raised below it).
  int line() const { return line_; }
  /// Keeps `ns` (a namespace this render made) until the end of the render, then empties
  /// it: a namespace can hold itself (`{% set ns.me = ns %}`), a cycle that reference
  /// counting alone never frees.
  void track_namespace(const Value& ns);
  ~Evaluator();

  /// Throws Error(what, "<template> line N").
  [[noreturn]] void fail(int line, const std::string& what) const;
  /// Throws Error "integer overflow in '<op>'" naming the line (Python's ints are
  /// unbounded; the interpreter's are int64, so a result past them is refused).
  [[noreturn]] void fail_overflow(int line, const std::string& op) const;
  /// Throws the UndefinedError of using `v` (an undefined value) as a value.
  [[noreturn]] void fail_undefined(int line, const Value& v) const;

 private:
  Value eval_expr(const Expr& e);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  Flow exec_for(const Node& n, std::string& out);
  void exec_set(const Node& n);
  Value call_macro(const Node& macro, Args& args, Kwargs& kwargs, int line);
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  bool compare(const std::string& op, const Value& a, const Value& b, int line);
  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);

  const std::string& name_;
  std::vector<Dict> frames_;  // [0]: builtins and the template's variables; then loop and macro scopes
  std::unordered_map<std::string, std::size_t> global_index_;  // name -> position in frames_[0]
  std::size_t scope_base_ = 1;  // the first frame of the innermost macro call (1: none)
  int64_t steps_ = 0;     // counted against kMaxSteps
  std::size_t copied_ = 0;  // bytes, counted against kMaxCopyBytes
  int call_depth_ = 0;    // macro calls in progress, against kMaxNestingDepth
  int eval_depth_ = 0;    // exec / eval / call_macro frames in progress, against kMaxEvalDepth
  int line_ = 1;          // of the innermost frame entered last
  std::vector<std::shared_ptr<Dict>> namespaces_;  // emptied at the end (track_namespace)
  friend class EvalNest;
};

// Builtins (jinja_builtins.cpp).
Value apply_filter(Evaluator& ev, const std::string& filter, const Value& v, Args& args, Kwargs& kwargs, int line);
bool apply_test(Evaluator& ev, const std::string& test, const Value& v, Args& args, int line);
/// The bound method `obj.name` (str / dict methods), or an undefined value.
Value get_method(const Value& obj, const std::string& name);
/// range, namespace, dict, raise_exception, strftime_now.
Dict builtin_globals();
/// `x in container` (Python's `in`).
bool contains(Evaluator& ev, const Value& container, const Value& item, int line);
/// The items a for loop visits (list items, dict keys, string characters).
List iterate(Evaluator& ev, const Value& v, int line);
/// The bytes a copy of `items` takes: each Value and its string (lists and dicts inside
/// are shared, not copied).
std::size_t list_bytes(const List& items);
/// Python's len() in code points for strings.
int64_t length(Evaluator& ev, const Value& v, int line);
/// UTF-8 <-> code points.
std::u32string to_u32(const std::string& s);
std::string from_u32(const std::u32string& s);

/// Renders `nodes` with `globals` (a dict value) as the template's variables.
/// @throws Error naming `name` and the line for runtime errors (raise_exception, type errors)
///   and for passing a limit above (evaluation depth, macro call depth, output and string
///   size, steps, repetition, list size, range()).
std::string render(const std::vector<Node>& nodes, const Value& globals, const std::string& name);

}  // namespace linnet::jinja
