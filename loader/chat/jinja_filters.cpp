// Jinja filters and globals. Filters follow jinja2/filters.py; `tojson` is transformers'
// override: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), so non-ASCII text stays as it is and `indent` switches the item
// separator from ", " to "," (Python's json rules). Globals are the ones transformers
// adds to its environment: raise_exception, strftime_now, namespace, dict; and range.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "common/error.h"
#include "loader/chat/jinja.h"

namespace linnet::jinja {
namespace {

const Value* arg(const Args& args, const Kwargs& kwargs, std::size_t k, const char* name) {
  if (k < args.size()) return &args[k];
  for (const auto& [key, v] : kwargs) {
    if (key == name) return &v;
  }
  return nullptr;
}

Value call_method(Evaluator& ev, const Value& obj, const std::string& name, Args args, int line) {
  Kwargs kwargs;
  const Value m = get_method(obj, name);
  if (m.is_undefined()) ev.fail(line, std::string("'") + obj.type_name() + "' has no method '" + name + "'");
  return ev.call(m, args, kwargs, line);
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t at = 0;
  for (;;) {
    const std::size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (const Value* f = cur.find(part)) {
      cur = *f;
    } else {
      std::string hint = "'";
      hint += cur.type_name();
      hint += " object' has no attribute '" + part + "'";
      return Value::undefined(std::move(hint));
    }
    if (dot == std::string::npos) return cur;
    at = dot + 1;
  }
}

// select / reject / selectattr / rejectattr: keep items whose test (or truthiness) holds.
Value select_items(Evaluator& ev, const std::string& f, const Value& v, Args& args, int line) {
  const bool by_attr = f == "selectattr" || f == "rejectattr";
  const bool keep_when = f == "select" || f == "selectattr";
  std::size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty() || !args[0].is_string()) ev.fail(line, "filter '" + f + "' needs an attribute name");
    attr = args[k++].s;
  }
  std::string test;
  if (k < args.size()) {
    if (!args[k].is_string()) ev.fail(line, "filter '" + f + "' needs a test name");
    test = args[k++].s;
    if (!has_test(test)) ev.fail(line, "unsupported Jinja construct: test '" + test + "'");
  }
  Args test_args(args.begin() + static_cast<std::ptrdiff_t>(k), args.end());
  List out;
  for (const Value& item : iterate(ev, v, line)) {
    const Value subject = by_attr ? attribute_of(item, attr) : item;
    const bool ok = test.empty() ? subject.truthy() : apply_test(ev, test, subject, test_args, line);
    if (ok == keep_when) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> k = {
      "trim",      "tojson",     "length", "count",  "items",   "join",    "list",  "first", "last",
      "default",   "d",          "upper",  "lower",  "capitalize", "title", "replace", "string", "int",
      "float",     "abs",        "select", "reject", "selectattr", "rejectattr", "map", "reverse", "safe"};
  return k;
}

// tojson(ensure_ascii, indent, separators, sort_keys), as Jinja2's htmlsafe_json_dumps
// without the HTML escaping (transformers' chat templates call it so).
Value filter_tojson(Evaluator& ev, const Value& v, Args& args, Kwargs& kwargs, int line) {
  using T = Value::Type;
  const Value* ensure_ascii = arg(args, kwargs, 0, "ensure_ascii");
  const Value* indent = arg(args, kwargs, 1, "indent");
  const Value* separators = arg(args, kwargs, 2, "separators");
  const Value* sort_keys = arg(args, kwargs, 3, "sort_keys");
  int ind = -1;
  if (indent && !indent->is_none()) {
    if (indent->type != T::kInt) ev.fail(line, "tojson: indent must be an integer");
    ind = static_cast<int>(std::clamp<int64_t>(indent->i, 0, static_cast<int64_t>(kMaxOutputBytes)));
  }
  std::string item_sep = ind >= 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (separators && !separators->is_none()) {
    if (separators->type != T::kList || separators->list->size() != 2 || !(*separators->list)[0].is_string() ||
        !(*separators->list)[1].is_string()) {
      ev.fail(line, "tojson: separators must be a pair of strings");
    }
    item_sep = (*separators->list)[0].s;
    key_sep = (*separators->list)[1].s;
  }
  std::string out;
  bool too_long = false;
  if (!to_json(v, ensure_ascii && ensure_ascii->truthy(), ind, item_sep, key_sep, sort_keys && sort_keys->truthy(),
               out, &too_long)) {
    if (v.is_undefined()) ev.fail_undefined(line, v);
    if (too_long) ev.check_size(kMaxOutputBytes + 1, line, "the result of tojson");
    ev.fail(line, std::string("tojson: a value of type '") + v.type_name() + "' (or inside it) is not JSON serializable");
  }
  return Value::string(std::move(out));
}

// join(d, attribute): the items' strings with separator d, bounded like every output.
Value filter_join(Evaluator& ev, const Value& v, Args& args, Kwargs& kwargs, int line) {
  const Value* sep = arg(args, kwargs, 0, "d");
  const Value* attr = arg(args, kwargs, 1, "attribute");
  std::string out;
  bool first = true;
  const std::string separator = sep ? to_str(*sep) : "";
  for (const Value& item : iterate(ev, v, line)) {
    const std::string text = to_str(attr ? attribute_of(item, to_str(*attr)) : item);
    ev.check_size(out.size() + (first ? 0 : separator.size()) + text.size(), line, "the result of join");
    if (!first) out += separator;
    first = false;
    out += text;
  }
  return Value::string(std::move(out));
}

// map(attribute=, default=) or map('filter', args...): each item's attribute, or each
// item through another supported filter.
Value filter_map(Evaluator& ev, const Value& v, Args& args, Kwargs& kwargs, int line) {
  const Value* attr = arg({}, kwargs, 0, "attribute");
  List out;
  for (const Value& item : iterate(ev, v, line)) {
    if (attr) {
      Value x = attribute_of(item, to_str(*attr));
      const Value* def = arg({}, kwargs, 0, "default");
      out.push_back(x.is_undefined() && def ? *def : x);
    } else {
      if (args.empty() || !args[0].is_string() || !has_filter(args[0].s)) {
        ev.fail(line, "filter 'map' needs attribute= or the name of a supported filter");
      }
      Args rest(args.begin() + 1, args.end());
      Kwargs none;
      out.push_back(apply_filter(ev, args[0].s, item, rest, none, line));
    }
  }
  return Value::make_list(std::move(out));
}

// int(default) / float(default): a number as Jinja2 converts it; an unparsable string
// gives the default (0).
Value filter_number(Evaluator& ev, bool is_int, const Value& v, Args& args, Kwargs& kwargs, int line) {
  using T = Value::Type;
  if (v.type == T::kInt || v.type == T::kBool) return is_int ? Value::integer(v.type == T::kBool ? v.b : v.i) : Value::real(static_cast<double>(v.type == T::kBool ? v.b : v.i));
  if (v.type == T::kFloat) {
    if (!is_int) return v;
    // [-2^63, 2^63): the floats int64 holds (the cast of any other is undefined).
    if (!(std::trunc(v.f) >= -9223372036854775808.0 && std::trunc(v.f) < 9223372036854775808.0)) {
      ev.fail(line, "filter 'int': " + float_repr(v.f) + " does not fit in 64 bits");
    }
    return Value::integer(static_cast<int64_t>(std::trunc(v.f)));
  }
  const Value* def = arg(args, kwargs, 0, "default");
  if (v.is_string()) {
    try {
      std::size_t used = 0;
      if (is_int) {
        const int64_t x = std::stoll(v.s, &used);
        if (used == v.s.size()) return Value::integer(x);
      } else {
        const double x = std::stod(v.s, &used);
        if (used == v.s.size()) return Value::real(x);
      }
    } catch (const std::exception&) {
    }
  }
  return def ? *def : (is_int ? Value::integer(0) : Value::real(0.0));
}

// abs: of an int (INT64_MIN has no int64 absolute value: an overflow error) or a float.
Value filter_abs(Evaluator& ev, const Value& v, int line) {
  using T = Value::Type;
  if (v.type == T::kInt || v.type == T::kBool) {
    const int64_t x = v.type == T::kBool ? v.b : v.i;
    if (x == INT64_MIN) ev.fail_overflow(line, "abs");
    return Value::integer(x < 0 ? -x : x);
  }
  if (v.type == T::kFloat) return Value::real(std::fabs(v.f));
  ev.fail(line, std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

}  // namespace

bool has_filter(const std::string& filter) { return filter_names().count(filter) > 0; }

Value apply_filter(Evaluator& ev, const std::string& f, const Value& v, Args& args, Kwargs& kwargs, int line) {
  using T = Value::Type;
  if (f == "default" || f == "d") {
    const Value* def = arg(args, kwargs, 0, "default_value");
    const Value* boolean = arg(args, kwargs, 1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_default ? (def ? *def : Value::string("")) : v;
  }
  if (f == "tojson") return filter_tojson(ev, v, args, kwargs, line);
  if (f == "safe") return v;
  if (f == "string") return Value::string(to_str(v));
  if (f == "length" || f == "count") return Value::integer(length(ev, v, line));
  if (f == "list") return Value::make_list(iterate(ev, v, line));
  if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
    if (!kwargs.empty()) ev.fail(line, "filter '" + f + "' takes no keyword arguments");
    return select_items(ev, f, v, args, line);
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (v.type != T::kDict) ev.fail(line, std::string("filter 'items' needs a mapping, got '") + v.type_name() + "'");
    return call_method(ev, v, "items", {}, line);
  }
  if (f == "join") return filter_join(ev, v, args, kwargs, line);
  if (f == "map") return filter_map(ev, v, args, kwargs, line);
  if (f == "first" || f == "last") {
    const List items = iterate(ev, v, line);
    if (items.empty()) return Value::undefined("the sequence is empty");
    return f == "first" ? items.front() : items.back();
  }
  if (f == "reverse") {
    if (v.is_string()) {
      const std::u32string u = to_u32(v.s);
      return Value::string(from_u32(std::u32string(u.rbegin(), u.rend())));
    }
    const List items = iterate(ev, v, line);
    return Value::make_list(List(items.rbegin(), items.rend()));
  }
  if (f == "int" || f == "float") return filter_number(ev, f == "int", v, args, kwargs, line);
  if (f == "abs") return filter_abs(ev, v, line);
  // The rest are string filters; Jinja2 applies them to str(value).
  if (v.is_undefined() && f != "trim") ev.fail_undefined(line, v);
  const Value s = Value::string(to_str(v));
  if (f == "trim") {
    Args a;
    if (const Value* chars = arg(args, kwargs, 0, "chars")) a.push_back(*chars);
    return call_method(ev, s, "strip", a, line);
  }
  if (f == "upper" || f == "lower" || f == "title") return call_method(ev, s, f, {}, line);
  if (f == "capitalize") return call_method(ev, s, "capitalize", {}, line);
  if (f == "replace") {
    Args a = args;
    if (const Value* c = arg({}, kwargs, 0, "count")) a.push_back(*c);
    return call_method(ev, s, "replace", a, line);
  }
  ev.fail(line, "unsupported Jinja construct: filter '" + f + "'");
}

Dict builtin_globals() {
  Dict g;
  g.emplace_back("raise_exception", Value::function([](Evaluator& ev, Args& args, Kwargs&, int line) -> Value {
                   ev.fail(line, "the template raised an exception: " + (args.empty() ? std::string() : to_str(args[0])));
                 }));
  g.emplace_back("strftime_now", Value::function([](Evaluator& ev, Args& args, Kwargs&, int line) -> Value {
                   if (args.empty() || !args[0].is_string()) ev.fail(line, "strftime_now() needs a format string");
                   const std::time_t now = std::time(nullptr);
                   std::tm local{};
                   localtime_r(&now, &local);
                   char buf[256];
                   const std::size_t n = std::strftime(buf, sizeof buf, args[0].s.c_str(), &local);
                   return Value::string(std::string(buf, n));
                 }));
  const auto make_mapping = [](bool ns) {
    return Value::function([ns](Evaluator& ev, Args& args, Kwargs& kwargs, int line) -> Value {
      Dict d;
      if (!args.empty()) {
        if (args.size() > 1 || args[0].type != Value::Type::kDict) ev.fail(line, "expected one mapping argument");
        d = *args[0].dict;
      }
      for (auto& [k, v] : kwargs) {
        bool replaced = false;
        for (auto& [dk, dv] : d) {
          if (dk == k) {
            dv = v;
            replaced = true;
          }
        }
        if (!replaced) d.emplace_back(k, v);
      }
      if (!ns) return Value::make_dict(std::move(d));
      Value v = Value::make_namespace(std::move(d));
      ev.track_namespace(v);
      return v;
    });
  };
  g.emplace_back("namespace", make_mapping(true));
  g.emplace_back("dict", make_mapping(false));
  g.emplace_back("range", Value::function([](Evaluator& ev, Args& args, Kwargs&, int line) -> Value {
                   int64_t start = 0, stop = 0, step = 1;
                   for (const Value& a : args) {
                     if (a.type != Value::Type::kInt) ev.fail(line, "range() needs integers");
                   }
                   if (args.size() == 1) {
                     stop = args[0].i;
                   } else if (args.size() == 2 || args.size() == 3) {
                     start = args[0].i;
                     stop = args[1].i;
                     if (args.size() == 3) step = args[2].i;
                   } else {
                     ev.fail(line, "range() takes 1 to 3 arguments");
                   }
                   if (step == 0) ev.fail(line, "range() step must not be zero");
                   List out;
                   for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
                     if (static_cast<int64_t>(out.size()) >= kMaxRangeItems) {
                       ev.fail(line, "range() too big (more than " + std::to_string(kMaxRangeItems) + " items)");
                     }
                     out.push_back(Value::integer(k));
                     if (__builtin_add_overflow(k, step, &k)) break;  // past int64: past stop too
                   }
                   return Value::make_list(std::move(out));
                 }));
  return g;
}

}  // namespace linnet::jinja
