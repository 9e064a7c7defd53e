// Jinja evaluator: statements and expressions over Values, with Jinja2's rules where
// they differ from plain Python: a missing key or index is an Undefined value (printed as
// "", false in tests, an error once used as a value); for-loop bodies get a fresh scope
// per iteration; dict attribute syntax finds methods before keys (jinja2/sandbox.py).
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "loader/chat/jinja.h"

namespace linnet::jinja {
namespace {

double as_double(const Value& v) {
  return v.type == Value::Type::kFloat ? v.f : static_cast<double>(v.type == Value::Type::kBool ? v.b : v.i);
}
int64_t as_int(const Value& v) { return v.type == Value::Type::kBool ? v.b : v.i; }
bool is_intlike(const Value& v) { return v.type == Value::Type::kInt || v.type == Value::Type::kBool; }

}  // namespace

// One evaluator frame (a statement list, an expression, a macro call) for its lifetime,
// counted against kMaxEvalDepth so that no template overflows the native stack.
class EvalNest {
 public:
  EvalNest(Evaluator& ev, int line) : ev_(ev) {
    if (ev_.eval_depth_ >= kMaxEvalDepth) {
      ev_.fail(line, "the template nests evaluation deeper than " + std::to_string(kMaxEvalDepth) +
                         " levels (macros calling macros?)");
    }
    ++ev_.eval_depth_;
    ev_.line_ = line;
  }
  ~EvalNest() { --ev_.eval_depth_; }
  EvalNest(const EvalNest&) = delete;
  EvalNest& operator=(const EvalNest&) = delete;

 private:
  Evaluator& ev_;
};

Evaluator::Evaluator(const std::string& name, const Value& globals) : name_(name) {
  frames_.emplace_back(builtin_globals());
  for (std::size_t k = 0; k < frames_[0].size(); ++k) global_index_.emplace(frames_[0][k].first, k);
  if (globals.dict) {
    for (const auto& [k, v] : *globals.dict) assign(k, v);
  }
}

Evaluator::~Evaluator() {
  for (const auto& ns : namespaces_) ns->clear();
}

void Evaluator::track_namespace(const Value& ns) {
  if (ns.dict) namespaces_.push_back(ns.dict);
}

void Evaluator::step(int line, int64_t n) {
  steps_ += n;
  if (steps_ > kMaxSteps) {
    fail(line, "the template takes more than " + std::to_string(kMaxSteps) +
                   " evaluation steps (loop iterations and calls); is a loop unbounded?");
  }
}

void Evaluator::copied(std::size_t bytes, int line) {
  copied_ += bytes;
  if (copied_ > kMaxCopyBytes) {
    fail(line, "the template copies more than " + std::to_string(kMaxCopyBytes) +
                   " bytes of strings and lists; does a loop build ever longer text?");
  }
}

void Evaluator::check_size(std::size_t bytes, int line, const char* what) const {
  if (bytes > kMaxOutputBytes) {
    fail(line, std::string(what) + " would be longer than " + std::to_string(kMaxOutputBytes) + " bytes (" +
                   std::to_string(bytes) + ")");
  }
}

void Evaluator::fail(int line, const std::string& what) const {
  throw Error(what, name_ + " line " + std::to_string(line));
}

void Evaluator::fail_overflow(int line, const std::string& op) const {
  fail(line, "integer overflow in '" + op + "' (the result does not fit in 64 bits)");
}

void Evaluator::fail_undefined(int line, const Value& v) const {
  fail(line, "undefined value: " + (v.s.empty() ? std::string("a value is undefined") : v.s));
}

// The frames a name is looked up in: the innermost ones down to scope_base_ (a macro
// call starts a new scope), then the global frame, through its index (a request can
// bring a million variables; scanning them for every name would be quadratic).
Value Evaluator::lookup(const std::string& name) const {
  for (std::size_t f = frames_.size(); f-- > std::max<std::size_t>(scope_base_, 1);) {
    for (const auto& [k, v] : frames_[f]) {
      if (k == name) return v;
    }
  }
  const auto it = global_index_.find(name);
  if (it != global_index_.end()) return frames_[0][it->second].second;
  return Value::undefined("'" + name + "' is undefined");
}

void Evaluator::assign(const std::string& name, Value v) {
  if (frames_.size() == 1) {
    const auto [it, added] = global_index_.emplace(name, frames_[0].size());
    if (added) {
      frames_[0].emplace_back(name, std::move(v));
    } else {
      frames_[0][it->second].second = std::move(v);
    }
    return;
  }
  for (auto& [k, old] : frames_.back()) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  frames_.back().emplace_back(name, std::move(v));
}

Evaluator::Flow Evaluator::exec(const std::vector<Node>& nodes, std::string& out) {
  if (nodes.empty()) return Flow::kNormal;
  const EvalNest nest(*this, nodes.front().line);
  for (const Node& n : nodes) {
    switch (n.kind) {
      case Node::Kind::kText:
        check_size(out.size() + n.text.size(), n.line, "the template output");
        out += n.text;
        break;
      case Node::Kind::kOutput: {
        const std::string text = to_str(eval(*n.expr));
        check_size(out.size() + text.size(), n.line, "the template output");
        out += text;
        break;
      }
      case Node::Kind::kIf: {
        bool taken = false;
        for (const auto& [cond, body] : n.branches) {
          if (eval(*cond).truthy()) {
            taken = true;
            const Flow f = exec(body, out);
            if (f != Flow::kNormal) return f;
            break;
          }
        }
        if (!taken) {
          const Flow f = exec(n.else_body, out);
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case Node::Kind::kFor: exec_for(n, out); break;
      case Node::Kind::kSet: exec_set(n); break;
      case Node::Kind::kSetBlock: {
        std::string text;
        exec(n.body, text);
        assign(n.targets[0], Value::string(std::move(text)));
        break;
      }
      case Node::Kind::kMacro: {
        const Node* macro = &n;
        assign(n.targets[0], Value::function([macro](Evaluator& ev, Args& args, Kwargs& kwargs, int line) {
                 return ev.call_macro(*macro, args, kwargs, line);
               }));
        break;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kBlock: {
        const Flow f = exec(n.body, out);
        if (f != Flow::kNormal) return f;
        break;
      }
    }
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec_for(const Node& n, std::string& out) {
  const Value seq = eval(*n.expr);
  List items = iterate(*this, seq, n.line);
  const auto bind = [&](const Value& item) {
    if (n.targets.size() == 1) {
      assign(n.targets[0], item);
      return;
    }
    const List parts = iterate(*this, item, n.line);
    if (parts.size() != n.targets.size()) {
      fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(n.targets.size()) + " loop variables");
    }
    for (std::size_t k = 0; k < parts.size(); ++k) assign(n.targets[k], parts[k]);
  };
  if (n.condition) {
    List kept;
    for (const Value& item : items) {
      frames_.emplace_back();
      bind(item);
      const bool keep = eval(*n.condition).truthy();
      frames_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(n.else_body, out);
  const auto count = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < count; ++k) {
    step(n.line);
    frames_.emplace_back();
    bind(items[static_cast<std::size_t>(k)]);
    Dict loop = {
        {"index", Value::integer(k + 1)},
        {"index0", Value::integer(k)},
        {"revindex", Value::integer(count - k)},
        {"revindex0", Value::integer(count - k - 1)},
        {"first", Value::boolean(k == 0)},
        {"last", Value::boolean(k == count - 1)},
        {"length", Value::integer(count)},
        {"previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined("there is no previous item")},
        {"nextitem", k + 1 < count ? items[static_cast<std::size_t>(k + 1)] : Value::undefined("there is no next item")},
    };
    assign("loop", Value::make_dict(std::move(loop)));
    const Flow f = exec(n.body, out);
    frames_.pop_back();
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Evaluator::exec_set(const Node& n) {
  Value v = eval(*n.expr);
  if (!n.attr.empty()) {
    Value ns = lookup(n.targets[0]);
    if (ns.type != Value::Type::kNamespace) {
      fail(n.line, "cannot assign attribute '" + n.attr + "' on '" + n.targets[0] + "': it is not a namespace()");
    }
    for (auto& [k, old] : *ns.dict) {
      if (k == n.attr) {
        old = std::move(v);
        return;
      }
    }
    ns.dict->emplace_back(n.attr, std::move(v));
    return;
  }
  if (n.targets.size() == 1) {
    assign(n.targets[0], std::move(v));
    return;
  }
  const List parts = iterate(*this, v, n.line);
  if (parts.size() != n.targets.size()) {
    fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(n.targets.size()) +
                     " names");
  }
  for (std::size_t k = 0; k < parts.size(); ++k) assign(n.targets[k], parts[k]);
}

Value Evaluator::call_macro(const Node& macro, Args& args, Kwargs& kwargs, int line) {
  if (args.size() > macro.params.size()) {
    fail(line, "macro '" + macro.targets[0] + "' takes " + std::to_string(macro.params.size()) + " arguments, " +
                   std::to_string(args.size()) + " given");
  }
  if (call_depth_ >= kMaxNestingDepth) {
    fail(line, "macro calls nested deeper than " + std::to_string(kMaxNestingDepth) + " levels ('" +
                   macro.targets[0] + "' calling itself without end?)");
  }
  const EvalNest nest(*this, line);
  ++call_depth_;
  struct Leave {
    int& depth;
    ~Leave() { --depth; }
  } leave{call_depth_};
  // A macro sees the template's top-level variables, not its caller's locals: its
  // frames start a scope above the caller's (the global frame is shared, not copied: a
  // copy per call cost O(variables) and copied every global string).
  const std::size_t saved_base = scope_base_;
  const std::size_t saved_size = frames_.size();
  scope_base_ = frames_.size();
  frames_.emplace_back();
  struct Restore {
    Evaluator& ev;
    std::size_t base, size;
    ~Restore() {
      ev.frames_.resize(size);
      ev.scope_base_ = base;
    }
  } restore{*this, saved_base, saved_size};
  std::string out;
  {
    for (std::size_t k = 0; k < macro.params.size(); ++k) {
      const auto& [param, def] = macro.params[k];
      Value v = Value::undefined("'" + param + "' is undefined");
      if (k < args.size()) {
        v = args[k];
      } else if (def) {
        v = eval(*def);
      }
      for (const auto& [key, kv] : kwargs) {
        if (key == param) v = kv;
      }
      assign(param, v);
    }
    for (const auto& [key, kv] : kwargs) {
      bool known = false;
      for (const auto& p : macro.params) known = known || p.first == key;
      if (!known) fail(line, "macro '" + macro.targets[0] + "' has no parameter '" + key + "'");
    }
    exec(macro.body, out);
  }
  return Value::string(std::move(out));
}

Value Evaluator::call(const Value& callee, Args& args, Kwargs& kwargs, int line) {
  if (callee.is_undefined()) fail_undefined(line, callee);
  if (callee.type != Value::Type::kFunction) fail(line, std::string("'") + callee.type_name() + "' object is not callable");
  step(line);
  return (*callee.fn)(*this, args, kwargs, line);
}

Value Evaluator::eval(const Expr& e) {
  const EvalNest nest(*this, e.line);
  Value v = eval_expr(e);
  if (v.is_string()) copied(v.s.size(), e.line);
  return v;
}

Value Evaluator::eval_expr(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      for (const auto& a : e.args) items.push_back(eval(*a));
      Value v = Value::make_list(std::move(items));
      v.tuple = e.kind == Expr::Kind::kTuple;
      return v;
    }
    case Expr::Kind::kDict: {
      Dict items;
      for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
        const Value key = eval(*e.args[k]);
        if (!key.is_string()) fail(e.line, std::string("dict keys must be strings here, got ") + key.type_name());
        Value val = eval(*e.args[k + 1]);
        bool replaced = false;
        for (auto& [kk, vv] : items) {
          if (kk == key.s) {
            vv = val;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(key.s, std::move(val));
      }
      return Value::make_dict(std::move(items));
    }
    case Expr::Kind::kGetAttr: return get_attr(eval(*e.args[0]), e.name, e.line);
    case Expr::Kind::kGetItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
    case Expr::Kind::kSlice: {
      const auto part = [&](std::size_t k) { return e.args[k] ? eval(*e.args[k]) : Value::none(); };
      return slice(eval(*e.args[0]), part(1), part(2), part(3), e.line);
    }
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.args[0]);
      Args args;
      for (std::size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
      Kwargs kwargs;
      for (const auto& [k, v] : e.kwargs) kwargs.emplace_back(k, eval(*v));
      return call(callee, args, kwargs, e.line);
    }
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest: {
      const Value v = eval(*e.args[0]);
      Args args;
      for (std::size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
      Kwargs kwargs;
      for (const auto& [k, kv] : e.kwargs) kwargs.emplace_back(k, eval(*kv));
      step(e.line);
      if (e.kind == Expr::Kind::kFilter) return apply_filter(*this, e.name, v, args, kwargs, e.line);
      if (!kwargs.empty()) fail(e.line, "test '" + e.name + "' takes no keyword arguments");
      return Value::boolean(apply_test(*this, e.name, v, args, e.line) != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0]);
      if (v.is_undefined()) fail_undefined(e.line, v);
      if (!v.is_number()) fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.type_name() + "'");
      if (e.kind == Expr::Kind::kPos) return is_intlike(v) ? Value::integer(as_int(v)) : v;
      if (!is_intlike(v)) return Value::real(-v.f);
      int64_t r = 0;
      if (__builtin_sub_overflow(int64_t{0}, as_int(v), &r)) fail_overflow(e.line, "-");
      return Value::integer(r);
    }
    case Expr::Kind::kNot: return Value::boolean(!eval(*e.args[0]).truthy());
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case Expr::Kind::kBinary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
    case Expr::Kind::kCompare: {
      Value left = eval(*e.args[0]);
      for (std::size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1]);
        if (!compare(e.ops[k], left, right, e.line)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::kCondExpr: {
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined("the conditional expression had no else branch");
    }
  }
  return Value::undefined();
}

Value Evaluator::binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string text = to_str(a);
    const std::string right = to_str(b);
    check_size(text.size() + right.size(), line, "the result of '~'");
    text += right;
    return Value::string(std::move(text));
  }
  if (a.is_undefined()) fail_undefined(line, a);
  if (b.is_undefined()) fail_undefined(line, b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && is_intlike(a) && is_intlike(b);
  const auto bad = [&]() -> Value {
    fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  int64_t r = 0;  // an int result, checked: Python's ints are unbounded, ours are int64
  if (op == "+") {
    if (ints) {
      if (__builtin_add_overflow(as_int(a), as_int(b), &r)) fail_overflow(line, op);
      return Value::integer(r);
    }
    if (nums) return Value::real(as_double(a) + as_double(b));
    if (a.is_string() && b.is_string()) {
      check_size(a.s.size() + b.s.size(), line, "the result of '+'");
      return Value::string(a.s + b.s);
    }
    if (a.type == Value::Type::kList && b.type == Value::Type::kList) {
      if (a.list->size() + b.list->size() > kMaxListItems) {
        fail(line, "the result of '+' would have more than " + std::to_string(kMaxListItems) + " items");
      }
      step(line, static_cast<int64_t>(a.list->size() + b.list->size()));
      copied(list_bytes(*a.list) + list_bytes(*b.list), line);
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items));
    }
    return bad();
  }
  if (op == "*") {
    if (ints) {
      if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) fail_overflow(line, op);
      return Value::integer(r);
    }
    if (nums) return Value::real(as_double(a) * as_double(b));
    // Python's sequence repetition; a count below 1 gives an empty sequence.
    const Value* s = a.is_string() || a.type == Value::Type::kList ? &a
                     : b.is_string() || b.type == Value::Type::kList ? &b
                                                                     : nullptr;
    const Value* n = is_intlike(a) ? &a : is_intlike(b) ? &b : nullptr;
    if (!s || !n) return bad();
    const auto times = static_cast<uint64_t>(std::max<int64_t>(0, as_int(*n)));
    const std::size_t unit = s->is_string() ? s->s.size() : s->list->size();
    const std::size_t limit = s->is_string() ? kMaxRepeatBytes : kMaxListItems;
    if (unit != 0 && times > limit / unit) {
      fail(line, std::string("the result of '*' would be longer than ") + std::to_string(limit) +
                     (s->is_string() ? " bytes" : " items") + " (" + std::to_string(unit) + " x " +
                     std::to_string(times) + ")");
    }
    if (s->is_string()) {
      std::string out;
      out.reserve(unit * times);
      for (uint64_t k = 0; k < times && unit != 0; ++k) out += s->s;
      return Value::string(std::move(out));
    }
    step(line, static_cast<int64_t>(unit * times));
    copied(list_bytes(*s->list) * times, line);
    List items;
    items.reserve(unit * times);
    for (uint64_t k = 0; k < times && unit != 0; ++k) items.insert(items.end(), s->list->begin(), s->list->end());
    return Value::make_list(std::move(items));
  }
  if (!nums) return bad();
  if (op == "-") {
    if (!ints) return Value::real(as_double(a) - as_double(b));
    if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) fail_overflow(line, op);
    return Value::integer(r);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      // By squaring: a loop of b multiplications would run for ages on `1 ** 10**12`.
      int64_t base = as_int(a);
      r = 1;
      for (int64_t e = as_int(b); e != 0;) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) fail_overflow(line, op);
        e >>= 1;
        if (e != 0 && __builtin_mul_overflow(base, base, &base)) fail_overflow(line, op);
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(as_double(a), as_double(b)));
  }
  if (as_double(b) == 0.0) fail(line, "division by zero");
  if (op == "/") return Value::real(as_double(a) / as_double(b));
  if (op == "//") {
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      if (x == INT64_MIN && y == -1) fail_overflow(line, op);  // the one quotient int64 cannot hold
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    return Value::real(std::floor(as_double(a) / as_double(b)));
  }
  if (op == "%") {
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      if (y == -1) return Value::integer(0);  // INT64_MIN % -1 traps on x86
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::integer(r);
    }
    const double y = as_double(b);
    double r = std::fmod(as_double(a), y);
    if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
    return Value::real(r);
  }
  return bad();
}

bool Evaluator::compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equal(a, b, this, line);
  if (op == "!=") return !equal(a, b, this, line);
  if (op == "in") return contains(*this, b, a, line);
  if (op == "not in") return !contains(*this, b, a, line);
  int c = 0;
  if (a.is_number() && b.is_number()) {
    const double x = as_double(a), y = as_double(b);
    c = x < y ? -1 : x > y ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    c = a.s.compare(b.s);
  } else {
    if (a.is_undefined()) fail_undefined(line, a);
    if (b.is_undefined()) fail_undefined(line, b);
    fail(line, "'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Value Evaluator::get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail_undefined(line, obj);
  if (obj.type == Value::Type::kDict) {
    Value m = get_method(obj, name);
    if (!m.is_undefined()) return m;
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  if (obj.type == Value::Type::kNamespace) {
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined("'Namespace' object has no attribute '" + name + "'");
  }
  Value m = get_method(obj, name);
  if (!m.is_undefined()) return m;
  std::string hint = "'";
  hint += obj.type_name();
  hint += " object' has no attribute '" + name + "'";
  return Value::undefined(std::move(hint));
}

Value Evaluator::get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail_undefined(line, obj);
  if (obj.type == Value::Type::kDict || obj.type == Value::Type::kNamespace) {
    if (key.is_string()) {
      if (const Value* v = obj.find(key.s)) return *v;
      return get_attr(obj, key.s, line);
    }
    return Value::undefined("'dict object' has no item " + to_repr(key));
  }
  if ((obj.type == Value::Type::kList || obj.is_string()) && is_intlike(key)) {
    int64_t idx = as_int(key);
    if (obj.type == Value::Type::kList) {
      const auto n = static_cast<int64_t>(obj.list->size());
      if (idx < 0) idx += n;
      if (idx < 0 || idx >= n) return Value::undefined(std::string(obj.type_name()) + " object has no element " + std::to_string(as_int(key)));
      return (*obj.list)[static_cast<std::size_t>(idx)];
    }
    const std::u32string s = to_u32(obj.s);
    const auto n = static_cast<int64_t>(s.size());
    if (idx < 0) idx += n;
    if (idx < 0 || idx >= n) return Value::undefined("str object has no element " + std::to_string(as_int(key)));
    return Value::string(from_u32(s.substr(static_cast<std::size_t>(idx), 1)));
  }
  if (key.is_string()) return get_attr(obj, key.s, line);
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no item " + to_repr(key));
}

Value Evaluator::slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v, int line) {
  if (obj.is_undefined()) fail_undefined(line, obj);
  for (const Value* p : {&start_v, &stop_v, &step_v}) {
    if (!p->is_none() && !is_intlike(*p)) fail(line, "slice indices must be integers or None");
  }
  const bool is_str = obj.is_string();
  if (!is_str && obj.type != Value::Type::kList) fail(line, std::string("'") + obj.type_name() + "' object is not subscriptable");
  const std::u32string s = is_str ? to_u32(obj.s) : std::u32string();
  const auto n = static_cast<int64_t>(is_str ? s.size() : obj.list->size());
  const int64_t step = step_v.is_none() ? 1 : as_int(step_v);
  if (step == 0) fail(line, "slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  const auto adjust = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t x = as_int(v);
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t start = adjust(start_v, step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(stop_v, step < 0 ? -1 : n);
  std::u32string out_s;
  List out_l;
  // The items taken count as steps (and list items as bytes copied), as iteration does.
  const uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : static_cast<uint64_t>(-(step + 1)) + 1;
  const int64_t span = step > 0 ? stop - start : start - stop;  // start, stop in [-1, n]
  const auto count = span > 0 ? static_cast<int64_t>((static_cast<uint64_t>(span) - 1) / stride + 1) : int64_t{0};
  this->step(line, count);
  if (!is_str) copied(static_cast<std::size_t>(count) * sizeof(Value), line);
  for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
    if (is_str) {
      out_s += s[static_cast<std::size_t>(k)];
    } else {
      out_l.push_back((*obj.list)[static_cast<std::size_t>(k)]);
    }
    if (__builtin_add_overflow(k, step, &k)) break;  // a step past int64 leaves the sequence
  }
  return is_str ? Value::string(from_u32(out_s)) : Value::make_list(std::move(out_l));
}

std::string render(const std::vector<Node>& nodes, const Value& globals, const std::string& name) {
  Evaluator ev(name, globals);
  std::string out;
  try {
    ev.exec(nodes, out);
  } catch (const ValueLimit& e) {
    ev.fail(ev.line(), e.what());
  }
  return out;
}

}  // namespace linnet::jinja
